"""PromptEncoder on the bundled tiny model with stand-in prompt encoders: what a clip becomes, what is refused,
and the voice file format. Parity with upstream's frontend is in tests/convert/test_voice_parity.py."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

from cosyvoice_server.engine.pipeline import Voice, load_voice, load_voices, save_voice
from cosyvoice_server.frontend import END_OF_PROMPT, TextFrontend
from cosyvoice_server.model.manifest import ModelLoadError, load_manifest
from cosyvoice_server.state import InstructionError, instruct
from cosyvoice_server.voices import spectral
from cosyvoice_server.voices.features import ClipError, PromptEncoder

TINY = Path(__file__).resolve().parents[2] / "inference_image" / "cosyvoice_server" / "models" / "tiny"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny model with ONNX stand-ins for campplus and the speech tokenizer (its 512-token vocabulary)."""
    from cosyvoice_server.convert.miniature import _onnx_stand_ins

    out = tmp_path_factory.mktemp("voices") / "tiny"
    shutil.copytree(TINY, out)
    _onnx_stand_ins(out, np.random.default_rng(0), speech_tokens=512)
    m = yaml.safe_load((out / "model.yaml").read_text())
    m["prompt_encoders"] = {"campplus": "campplus.onnx", "speech_tokenizer": "speech_tokenizer_v2.onnx"}
    (out / "model.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def frontend(model_dir) -> TextFrontend:
    return TextFrontend(model_dir / "tokenizer.json", 80)


@pytest.fixture(scope="module")
def encoder(model_dir, frontend) -> PromptEncoder:
    return PromptEncoder(model_dir, load_manifest(model_dir), frontend)


def chirp(sr: int, seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(sr * seconds))) / sr
    return (0.4 * np.sin(2 * np.pi * (120 * t + 40 * t**2)) + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def test_a_clip_with_a_transcript_is_a_zero_shot_voice(encoder, frontend):
    v = encoder.extract(chirp(44100, 3.0), 44100, "I have 12 apples.", "mine")
    assert v.name == "mine" and not v.cross_lingual
    assert v.prompt_text_tokens.tolist() == frontend.encode("I have twelve apples.")  # normalized as synthesis input
    assert len(v.prompt_speech_tokens) == 75  # 25 tokens/s
    assert v.prompt_mel.shape == (150, 80) and v.embedding.shape == (192,)
    assert v.llm_prompt_speech_tokens.tolist() == v.prompt_speech_tokens.tolist()
    assert np.isfinite(v.prompt_mel).all() and np.abs(v.embedding).max() > 0


def test_without_a_transcript_the_voice_is_cross_lingual(encoder):
    clip = chirp(16000, 2.0)
    xl, zs = encoder.extract(clip, 16000, None), encoder.extract(clip, 16000, "hello")
    assert xl.cross_lingual and len(xl.prompt_text_tokens) == 0 and len(xl.llm_prompt_speech_tokens) == 0
    # the flow's prompt is the same as the zero-shot voice's
    assert np.array_equal(xl.prompt_speech_tokens, zs.prompt_speech_tokens)
    assert np.array_equal(xl.prompt_mel, zs.prompt_mel) and np.array_equal(xl.embedding, zs.embedding)


def test_tokens_and_mel_are_cut_to_a_common_length(encoder):
    clip = chirp(16000, 1.97)  # 50 tokens from 197 log-mel frames, 98 mel frames at 24 kHz
    raw = encoder.speech_tokens(clip)
    v = encoder.extract(clip, 16000, None)
    assert len(raw) == 50 and len(v.prompt_speech_tokens) == 49 and v.prompt_mel.shape[0] == 98
    assert v.prompt_speech_tokens.tolist() == raw[:49].tolist()


@pytest.mark.parametrize("audio, sr, transcript, message", [
    (np.zeros(48000, np.float32), 48000, None, "silent"),
    (np.full(48000, 1e-4, np.float32), 48000, None, "silent"),
    (chirp(8000, 2.0), 8000, None, "8000 Hz"),
    (chirp(16000, 30.5), 16000, None, "at most 30 s"),
    (chirp(16000, 0.01), 16000, None, "too short"),
    (np.zeros(0, np.float32), 16000, None, "too short"),
    (np.stack([chirp(16000, 1.0)] * 2, axis=1), 16000, None, "mono"),
    (np.where(np.arange(16000) == 5, np.nan, chirp(16000, 1.0)).astype(np.float32), 16000, None, "not finite"),
    (chirp(16000, 1.0), 16000, "  \t ", "transcript"),
])
def test_clips_upstream_cannot_use_raise_clip_error(encoder, audio, sr, transcript, message):
    with pytest.raises(ClipError, match=message):
        encoder.extract(audio, sr, transcript)


def test_a_model_without_prompt_encoders_says_so(model_dir, frontend, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare)
    m = yaml.safe_load((bare / "model.yaml").read_text())
    del m["prompt_encoders"]
    (bare / "model.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    with pytest.raises(ModelLoadError, match="prompt_encoders"):
        PromptEncoder(bare, load_manifest(bare), frontend)


def test_tokens_beyond_the_llm_vocabulary_mean_a_mismatched_tokenizer(model_dir, frontend, tmp_path):
    from cosyvoice_server.convert.miniature import _onnx_stand_ins

    other = tmp_path / "m"
    shutil.copytree(model_dir, other)
    _onnx_stand_ins(other, np.random.default_rng(0))  # 6561 tokens, as CosyVoice2's tokenizer
    with pytest.raises(ModelLoadError, match="speech tokens"):
        PromptEncoder(other, load_manifest(other), frontend).extract(chirp(16000, 3.0), 16000, None)


def test_extract_from_several_threads_gives_the_same_voices(encoder):
    clips = [chirp(24000, 1.5, seed=i) for i in range(4)]
    alone = [encoder.extract(c, 24000, "hello there") for c in clips]
    out: list[Voice | None] = [None] * 8

    def run(i):
        out[i] = encoder.extract(clips[i % 4], 24000, "hello there")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, v in enumerate(out):
        assert np.array_equal(v.prompt_mel, alone[i % 4].prompt_mel)
        assert np.array_equal(v.prompt_speech_tokens, alone[i % 4].prompt_speech_tokens)


# The voice file ----------------------------------------------------------------------------------------
def test_voices_save_and_load_as_the_model_voices_dir_holds_them(encoder, model_dir, tmp_path):
    m = load_manifest(model_dir)
    for transcript in ("hello", None):
        v = encoder.extract(chirp(16000, 2.0), 16000, transcript, "x")
        save_voice(tmp_path / "x.npz", v)
        back = load_voice(tmp_path / "x.npz", m)
        assert back.cross_lingual == (transcript is None)
        for key in ("embedding", "prompt_text_tokens", "prompt_speech_tokens", "prompt_mel"):
            assert np.array_equal(getattr(back, key), getattr(v, key))
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]  # no temporary file left
    bundled = load_voices(TINY, load_manifest(TINY))  # files without the cross_lingual flag
    assert set(bundled) == {"default", "bright", "warm"} and not any(v.cross_lingual for v in bundled.values())


def test_a_failed_save_leaves_nothing(encoder, tmp_path, monkeypatch):
    v = encoder.extract(chirp(16000, 2.0), 16000, None)

    def broken(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        save_voice(tmp_path / "v.npz", v)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, message", [(b"not a zip", "not a readable"), (None, "prompt_mel has shape")])
def test_damaged_voice_files_are_named(encoder, model_dir, tmp_path, content, message):
    path = tmp_path / "bad.npz"
    if content is None:
        v = encoder.extract(chirp(16000, 2.0), 16000, None)
        np.savez(path, embedding=v.embedding, prompt_text_tokens=v.prompt_text_tokens,
                 prompt_speech_tokens=v.prompt_speech_tokens, prompt_mel=v.prompt_mel[:-2])
    else:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message) as err:
        load_voice(path, load_manifest(model_dir))
    assert str(path) in str(err.value)


# Instructions (upstream's instruct2 input) -------------------------------------------------------------
@pytest.fixture(scope="module")
def no_prompt_end_frontend(model_dir, tmp_path_factory) -> TextFrontend:
    """The tiny tokenizer without CosyVoice2's end-of-prompt token (as a tokenizer without upstream's added
    tokens has none)."""
    import json

    tok = json.loads((model_dir / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != END_OF_PROMPT]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(json.dumps(tok))
    return TextFrontend(path, 80)


def test_instructions_replace_the_llm_prompt_and_keep_the_flow_prompt(encoder, frontend):
    v = encoder.extract(chirp(16000, 2.0), 16000, "hello there")
    eop = frontend.tokenizer.token_to_id(END_OF_PROMPT)
    iv = instruct(v, "Speak  slowly.", frontend)
    assert iv.prompt_text_tokens.tolist() == frontend.encode("Speak slowly.") + [eop]
    assert iv.cross_lingual and len(iv.llm_prompt_speech_tokens) == 0
    assert np.array_equal(iv.prompt_speech_tokens, v.prompt_speech_tokens) and np.array_equal(iv.prompt_mel, v.prompt_mel)
    # an instruction that already ends in the token (upstream's README writes it so) gets no second one
    assert instruct(v, f"Speak slowly.{END_OF_PROMPT}", frontend).prompt_text_tokens.tolist()[-2:] != [eop, eop]


def test_instructions_are_refused_for_sft_voices_and_models_without_the_token(encoder, frontend, no_prompt_end_frontend):
    sft = load_voices(TINY, load_manifest(TINY))["default"]
    with pytest.raises(InstructionError, match="'default'.*without prompt speech"):
        instruct(sft, "Speak slowly.", frontend)
    cloned = encoder.extract(chirp(16000, 2.0), 16000, None)
    with pytest.raises(InstructionError, match="endofprompt"):
        instruct(cloned, "Speak slowly.", no_prompt_end_frontend)
    with pytest.raises(InstructionError, match="tokens long"):
        instruct(cloned, "slowly " * 300, frontend)


# The signal processing, by what it must do (parity with torchaudio/whisper/Matcha: tests/convert) ------
@pytest.mark.parametrize("orig, new", [(48000, 16000), (44100, 16000), (44100, 24000), (16000, 24000), (22050, 16000)])
def test_resampling_keeps_a_tone_and_the_length(orig, new):
    t = np.arange(orig * 2) / orig
    out = spectral.resample((0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32), orig, new)
    assert len(out) == int(np.ceil(len(t) * new / orig))
    spectrum = np.abs(np.fft.rfft(out[new // 4 : -new // 4]))
    peak_hz = np.argmax(spectrum) * new / len(out[new // 4 : -new // 4])
    assert abs(peak_hz - 1000) < 2 and abs(np.abs(out[new // 4 : -new // 4]).max() - 0.5) < 0.01


@pytest.mark.parametrize("orig", [16001, 22051, 44101, 191999, 192000])
def test_resampling_any_rate_takes_little_memory_and_time(orig):
    """A rate sharing no factor with the targets (16001 Hz) made torchaudio's kernel [16000, 16015] doubles: 2 GB
    and half a minute for a 38 KB clip."""
    import time
    import tracemalloc

    t = np.arange(orig * 5) / orig
    tone = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    tracemalloc.start()
    started = time.monotonic()
    try:
        outs = {new: spectral.resample(tone, orig, new) for new in (16000, 24000)}
        took, (_, peak) = time.monotonic() - started, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20 and took < 5, (peak, took)
    for new, out in outs.items():
        assert len(out) == int(np.ceil(len(t) * new / orig))
        middle = out[new // 4 : -new // 4]
        assert abs(np.argmax(np.abs(np.fft.rfft(middle))) * new / len(middle) - 1000) < 2
        assert abs(np.abs(middle).max() - 0.5) < 0.01


def test_resampling_removes_what_the_new_rate_cannot_hold():
    t = np.arange(48000) / 48000
    out = spectral.resample((0.5 * np.sin(2 * np.pi * 11000 * t)).astype(np.float32), 48000, 16000)
    assert np.abs(out[4000:-4000]).max() < 0.005  # 11 kHz is above the 8 kHz Nyquist: filtered, not aliased


def test_mel_filters_are_slaney_triangles_of_unit_area():
    f = spectral.mel_filters(24000, 1920, 80, 0.0, 8000.0)
    assert f.shape == (80, 961) and (f >= 0).all()
    hz = np.fft.rfftfreq(1920, 1 / 24000)
    assert f[:, hz > 8000].max() == 0  # fmax
    area = (f * (hz[1] - hz[0])).sum(axis=1)
    assert np.allclose(area[1:-1], 1.0, rtol=0.05)  # Slaney norm: equal area per filter


def test_a_cross_lingual_voice_gives_the_llm_no_prompt_speech_in_either_mode(encoder):
    """Whole-text requests and streamed-text sessions build their LLM prefix from the same voice fields."""
    from types import SimpleNamespace

    from cosyvoice_server.engine.pipeline import Pipeline
    from cosyvoice_server.scheduling.request import WholeText
    from cosyvoice_server.scheduling.scheduler import Scheduler

    p = Pipeline(TINY, "cpu", "fp32")
    xl = encoder.extract(chirp(16000, 2.0), 16000, None)
    zs = encoder.extract(chirp(16000, 2.0), 16000, "hello")
    host = SimpleNamespace(p=p)
    for voice in (xl, zs):
        req = SimpleNamespace(voice=voice, text=WholeText([np.arange(5)]), segment=0, rng=np.random.default_rng(0),
                              max_tokens=100, tokens=[])
        whole, streamed = Scheduler._sequence(host, req), Scheduler._session_sequence(host, req)
        want = len(voice.prompt_text_tokens) + 5 + 2 + (0 if voice.cross_lingual else len(voice.prompt_speech_tokens))
        assert len(whole.prompt) == want  # sos, prompt text + text, task id, prompt speech
        assert streamed.bistream.prompt_speech == ([] if voice.cross_lingual else voice.prompt_speech_tokens.tolist())
