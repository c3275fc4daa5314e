"""Voice cloning against upstream CosyVoice2 on the miniature checkpoint (random tokenizer and campplus graphs).

Features: the server's PromptEncoder against upstream's frontend (`frontend_zero_shot`, `frontend_cross_lingual`,
`frontend_instruct2` and the `_extract_*` methods they call; see upstream_frontend.py) on the same clips, at
16 kHz (the snapshot's whole frontend) and at 22.05 / 44.1 / 48 kHz (main's `load_wav` resampling order):
speech tokens equal, embedding and prompt mel within 1e-4.

End to end: the voices saved into the model's voices/ dir, served over HTTP, zero-shot, cross-lingual and with
instructions (instruct2), against upstream's Qwen2LM.inference (greedy) and CosyVoice2Model's token2wav loop
fed upstream's own frontend output; seeded, so the audio agrees sample for sample.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from test_http import PCM_TOL

from cosyvoice_server.engine.pipeline import Pipeline, load_voice, save_voice
from cosyvoice_server.scheduling.request import request_rngs
from cosyvoice_server.voices.features import ClipError, PromptEncoder

upstream_frontend = pytest.importorskip("upstream_frontend")

TOL = 1e-4
TRANSCRIPT = "Hello world, I paid 12 dollars for this."
INSTRUCTION = "Speak slowly, in a warm voice."
TEXT = "The quick brown fox jumps over the lazy dog, streaming chunk by chunk."


def speechlike(sr: int, seconds: float = 5.0, seed: int = 0) -> np.ndarray:
    """A voiced-speech-like clip: a gliding harmonic series under a syllable-rate envelope, plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    phase = 2 * np.pi * np.cumsum(150 + 40 * np.sin(2 * np.pi * 0.7 * t)) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t)) ** 2
    return (0.3 * voiced + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


@pytest.fixture(scope="session")
def upstream_fe(checkpoint):
    try:
        return upstream_frontend.load(checkpoint)
    except upstream_frontend.Missing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def encoder(pipeline):
    return PromptEncoder(pipeline.model_dir, pipeline.manifest, pipeline.frontend)


def report(what: str, err: float) -> None:
    print(f"\nPARITY {what}: max abs {err:.2e}")


@pytest.fixture(scope="session")
def token_margin(checkpoint):
    """How far the stand-in tokenizer's value (|p . log-mel| x scale, before the integer cast) lies from the
    nearest step, per token, on upstream's log-mel: where it is under 0.05, float32 rounding (about 0.02
    here: log-mel within 2e-6 of upstream's, times 1000) decides the token, in upstream as here."""
    import onnx
    from onnx import numpy_helper

    init = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(checkpoint / "speech_tokenizer_v2.onnx")).graph.initializer}

    def margin(speech16: torch.Tensor) -> np.ndarray:
        from cosyvoice.cli.frontend import whisper

        feats = whisper.log_mel_spectrogram(speech16, n_mels=128)[0].numpy().astype(np.float64)
        value = np.abs(feats.T[::4] @ init["p"].astype(np.float64))[:, 0] * float(init["scale"])
        return np.abs(value - np.round(value))

    return margin


def _compare(voice, want: dict, what: str, margin: np.ndarray) -> None:
    tokens = want["flow_prompt_speech_token"][0].numpy()
    got = voice.prompt_speech_tokens
    assert len(tokens) > 100 and len(got) == len(tokens)
    differ, margin = got != tokens, margin[: len(tokens)]
    assert not (differ & (margin > 0.05)).any(), "tokens differ away from a quantization step"
    assert (np.abs(got - tokens)[differ] <= 1).all()  # one step, hence the same cast of a value on the boundary
    print(f"\nPARITY voice {what} speech tokens: {len(tokens) - differ.sum()} of {len(tokens)} equal, "
          f"{differ.sum()} one step apart where upstream's value is within {margin[differ].max() if differ.any() else 0:.3f} of a step")
    assert voice.prompt_mel.shape == tuple(want["prompt_speech_feat"][0].shape) == (2 * len(tokens), 80)
    emb = float(np.abs(voice.embedding - want["flow_embedding"][0].numpy()).max())
    mel = float(np.abs(voice.prompt_mel - want["prompt_speech_feat"][0].numpy()).max())
    assert float(np.abs(voice.embedding).max()) > 0.1  # the stand-in campplus gives a non-trivial embedding
    report(f"voice {what} speaker embedding", emb)
    report(f"voice {what} prompt mel", mel)
    assert emb <= TOL and mel <= TOL


@pytest.mark.parametrize("orig, new", [(48000, 16000), (44100, 16000), (22050, 16000), (48000, 24000),
                                       (44100, 24000), (16000, 24000)])
def test_resampling_is_torchaudios(upstream_fe, orig, new):
    from cosyvoice_server.voices import spectral

    clip = speechlike(orig, 2.0, seed=orig + new)
    err = float(np.abs(spectral.resample(clip, orig, new) - upstream_frontend.resample(clip, orig, new)[0].numpy()).max())
    report(f"resample {orig} -> {new} Hz vs torchaudio.transforms.Resample", err)
    assert err <= 1e-6


def test_log_mels_are_whispers_and_matchas(upstream_fe):
    from cosyvoice.cli.frontend import whisper

    from cosyvoice_server.voices import spectral

    filters = np.load(Path(whisper.__path__[0]) / "assets" / "mel_filters.npz")["mel_128"]
    assert np.array_equal(spectral.mel_filters(16000, 400, 128, 0.0, 8000.0), filters)  # librosa's, bit for bit
    clip = speechlike(16000, 5.0)
    err = float(np.abs(spectral.whisper_log_mel(clip) - whisper.log_mel_spectrogram(torch.from_numpy(clip)[None], n_mels=128)[0].numpy()).max())
    report("whisper 128-bin log-mel", err)  # largest in quiet bins, where float32 STFT error is relatively large
    assert err <= TOL
    clip24 = speechlike(24000, 5.0)
    err = float(np.abs(spectral.prompt_mel(clip24) - upstream_fe.feat_extractor(torch.from_numpy(clip24)[None])[0].numpy().T).max())
    report("24 kHz prompt mel (Matcha mel_spectrogram)", err)
    assert err <= TOL


def test_zero_shot_features_at_16k_match_upstream_frontend(encoder, upstream_fe, token_margin):
    clip = speechlike(16000)
    voice = encoder.extract(clip, 16000, TRANSCRIPT)
    want = upstream_fe.frontend_zero_shot("", upstream_fe.text_normalize(TRANSCRIPT, split=False),
                                          torch.from_numpy(clip)[None], 24000, "")
    _compare(voice, want, "16 kHz", token_margin(torch.from_numpy(clip)[None]))
    assert voice.prompt_text_tokens.tolist() == want["prompt_text"][0].tolist()
    assert voice.llm_prompt_speech_tokens.tolist() == want["llm_prompt_speech_token"][0].tolist()
    assert not voice.cross_lingual


@pytest.mark.parametrize("sr", [22050, 44100, 48000])
def test_features_from_other_rates_match_upstream_main_load_wav_order(encoder, upstream_fe, token_margin, sr):
    clip = speechlike(sr, 4.3, seed=sr)
    voice = encoder.extract(clip, sr, TRANSCRIPT)
    want = upstream_frontend.main_zero_shot(upstream_fe, TRANSCRIPT, clip, sr)
    _compare(voice, want, f"{sr / 1000:g} kHz", token_margin(upstream_frontend.resample(clip, sr, 16000)))
    assert voice.prompt_text_tokens.tolist() == want["prompt_text"][0].tolist()


def test_cross_lingual_voice_is_upstream_frontend_cross_lingual(encoder, upstream_fe, token_margin):
    clip = speechlike(16000, seed=3)
    voice = encoder.extract(clip, 16000, None)
    want = upstream_fe.frontend_cross_lingual("", torch.from_numpy(clip)[None], 24000, "")
    assert not {"prompt_text", "llm_prompt_speech_token"} & set(want)
    _compare(voice, want, "cross-lingual", token_margin(torch.from_numpy(clip)[None]))
    assert voice.cross_lingual and len(voice.prompt_text_tokens) == 0 and len(voice.llm_prompt_speech_tokens) == 0


def test_the_30_second_limit_is_upstreams(encoder, upstream_fe):
    at_limit, over = speechlike(16000, 30.0), speechlike(16000, 30.01)
    assert len(encoder.extract(at_limit, 16000, None).prompt_speech_tokens) == 750
    with pytest.raises(AssertionError, match="30s"):
        upstream_fe._extract_speech_token(torch.from_numpy(over)[None])
    with pytest.raises(ClipError, match="at most 30 s"):
        encoder.extract(over, 16000, None)


# End to end ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def voices(encoder, upstream_fe):
    """The server's voices and upstream's model inputs for the same clip (16 kHz, the snapshot's frontend)."""
    clip = speechlike(16000, 4.0, seed=11)
    speech = torch.from_numpy(clip)[None]
    ours = {"clone": encoder.extract(clip, 16000, TRANSCRIPT, "clone"),
            "clone-xl": encoder.extract(clip, 16000, None, "clone-xl")}
    ups = {"clone": upstream_fe.frontend_zero_shot("", upstream_fe.text_normalize(TRANSCRIPT, split=False), speech, 24000, ""),
           "clone-xl": upstream_fe.frontend_cross_lingual("", speech, 24000, ""),
           "instruct2": upstream_fe.frontend_instruct2("", INSTRUCTION, speech, 24000, "")}
    return ours, ups


def _spk(model_input: dict) -> dict:
    """Reference.speaker's shape from upstream's model_input (no LLM prompt where upstream deleted it)."""
    empty = torch.zeros(1, 0, dtype=torch.int32)
    return {"embedding": model_input["flow_embedding"], "prompt_text": model_input.get("prompt_text", empty),
            "prompt_token": model_input["flow_prompt_speech_token"], "prompt_feat": model_input["prompt_speech_feat"],
            "llm_prompt_token": model_input.get("llm_prompt_speech_token", empty)}


def test_llm_logits_with_instructions_match_upstream_under_teacher_forcing(pipeline, reference, voices, monkeypatch):
    """Greedy tokens of random weights hardly depend on the prompt text; the logits do."""
    from cosyvoice_server.state import instruct

    text = pipeline.frontend.segments(TEXT)[0]
    forced = np.random.default_rng(1).integers(0, 6561, 20).tolist()
    llm = pipeline.llm

    def engine_logits(v):
        got = []

        def record(seqs, logits):
            got.append(logits[0].copy())
            seqs[0].tokens.append(forced[len(got) - 1] if len(got) <= len(forced) else 0)

        monkeypatch.setattr(llm, "_sample", record)
        batch = llm.prefill([llm.sequence(text, v.prompt_text_tokens, v.llm_prompt_speech_tokens, np.random.default_rng(0), None)])
        for _ in forced:
            llm.step(batch)
        return np.stack(got)

    ours = voices[0]["clone"]
    got = engine_logits(instruct(ours, INSTRUCTION, pipeline.frontend))
    want = reference.teacher_forced_logits(text.tolist(), _spk(voices[1]["instruct2"]), forced)
    err = float(np.abs(got - want).max())
    report(f"instruct2 LLM logits ({len(forced) + 1} steps)", err)
    assert err <= TOL
    without = engine_logits(voices[0]["clone-xl"])  # the same prefix less the instruction
    assert float(np.abs(got - without).max()) > 100 * TOL


@pytest.fixture(scope="module")
def cloned_model(converted, voices, tmp_path_factory):
    """The converted model with the cloned voices saved into its voices/ dir."""
    out = tmp_path_factory.mktemp("cloned") / "model"
    shutil.copytree(converted, out)
    for name, v in voices[0].items():
        save_voice(out / "voices" / f"{name}.npz", v)
    return out


# (voice, instructions, upstream input)
MODES = [("clone", None, "clone"), ("clone-xl", None, "clone-xl"), ("clone", INSTRUCTION, "instruct2")]


@pytest.mark.parametrize("voice, instructions, mode", MODES)
def test_greedy_tokens_match_upstream_qwen2lm(cloned_model, pipeline, reference, voices, voice, instructions, mode):
    from cosyvoice_server.state import instruct

    p = Pipeline(cloned_model, "cpu", "fp32")
    v = p.voices[voice]
    assert v.cross_lingual == (voice == "clone-xl")
    if instructions:
        v = instruct(v, instructions, p.frontend)
    text = p.frontend.segments(TEXT)[0]
    seq = p.llm.sequence(text, v.prompt_text_tokens, v.llm_prompt_speech_tokens, np.random.default_rng(0), None)
    batch = p.llm.prefill([seq])
    while batch is not None:
        p.llm.step(batch)
        batch = p.llm.keep(batch, [i for i, q in enumerate(batch.seqs) if not q.done])
    spk = _spk(voices[1][mode])
    assert v.prompt_text_tokens.tolist() == spk["prompt_text"][0].tolist()
    want = reference.tokens(text.tolist(), spk)
    same = sum(a == b for a, b in zip(seq.tokens, want))
    print(f"\nPARITY {mode} greedy speech tokens: {same} of {len(want)} equal (engine made {len(seq.tokens)})")
    assert seq.tokens == want


def test_http_audio_matches_upstream(cloned_model, start_server, pipeline, reference, voices):
    served = start_server("--model-dir", str(cloned_model))
    text = pipeline.frontend.segments(TEXT)[0].tolist()

    async def speak(body):
        async with httpx.AsyncClient(timeout=120) as c:
            return await c.post(served.url + "/v1/audio/speech", json={"model": "tts-1", "input": TEXT, **body})

    by_mode = {}
    for voice, instructions, mode in MODES:
        spk = _spk(voices[1][mode])
        tokens = by_mode[mode] = reference.tokens(text, spk)
        # streamed once: the chunk plan pads the first hop by the flow prompt's length, which a cross-lingual
        # voice keeps while its LLM prompt is empty
        for stream in (False, True) if mode == "clone-xl" else (False,):
            body = {"voice": voice, "response_format": "pcm", "stream": stream, "seed": 5}
            r = asyncio.run(speak(body | ({"instructions": instructions} if instructions else {})))
            assert r.status_code == 200, r.text
            audio = np.frombuffer(r.content, "<i2").astype(np.float32) / 32767
            noise = request_rngs(5)[1]
            want = np.concatenate(reference.tts(tokens, spk, stream, lambda n: noise.standard_normal((n, 9), np.float32)))
            assert audio.shape == want.shape
            err = float(np.abs(audio - want).max())
            print(f"\nPARITY HTTP {mode} {'streamed' if stream else 'whole'} ({len(tokens)} tokens): max abs {err:.2e}")
            assert err <= PCM_TOL

    assert by_mode["clone"] != by_mode["clone-xl"]  # the prompt speech in the LLM prefix changes the speech

    # upstream's CosyVoice2 takes instructions only with a prompt clip: an SFT voice is refused, saying why
    r = asyncio.run(speak({"voice": "spk_a", "instructions": INSTRUCTION}))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "instructions" and err["code"] == "unsupported_parameter"
    assert "spk_a" in err["message"] and "prompt speech" in err["message"]


def test_saved_voices_load_back_exactly(cloned_model, pipeline, voices):
    for name, v in voices[0].items():
        back = load_voice(cloned_model / "voices" / f"{name}.npz", pipeline.manifest)
        assert back.cross_lingual == v.cross_lingual
        for key in ("embedding", "prompt_text_tokens", "prompt_speech_tokens", "prompt_mel"):
            assert np.array_equal(getattr(back, key), getattr(v, key))

