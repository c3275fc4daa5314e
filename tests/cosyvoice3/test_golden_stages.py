"""Each stage of the converted CosyVoice3 miniature against upstream's own outputs for the same inputs: the text
ids (with CosyVoice3's markup), the LLM's log-probabilities and picks (alone and in a batch of 8), every
`flow.inference` call (alone and all in one batch), every `hift.inference` call with upstream's source buffers,
and the prompt mel of a clip. Measured errors print as PARITY lines (`pytest -s`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cosyvoice_server.engine.flow import FlowChunk, VocoderInput
from cosyvoice_server.engine.sampling import log_softmax
from cosyvoice_server.streaming import drop_silence

LOGP_TOL = 1e-4  # log-probabilities near -9: ONNX Runtime's float32 against torch's
MEL_TOL = 1e-4  # mel values up to ~5.5
WAV_TOL = 1e-5  # waveform samples up to ~0.6
WHOLE_TEXT = ("river_whole", "river_stream", "lamp_stream", "lamp_whole", "short_whole", "market_stream")


def report(what: str, err: float) -> None:
    print(f"\nPARITY cosyvoice3 {what}: max abs {err:.2e}")


def test_text_ids_with_markup_equal_upstreams(golden, cv3_pipeline):
    cases = json.loads((golden / "tokenizer.json").read_text())["cases"]
    assert any("[AY1]" in c["text"] for c in cases) and any("[iā]" in c["text"] for c in cases)
    for c in cases:
        assert cv3_pipeline.frontend.encode(c["text"]) == c["ids"], c["text"]


def test_an_instruction_is_upstreams_cosyvoice3_instruct_prompt(golden, cv3_pipeline):
    """`instructions` become `You are a helpful assistant. <instruction><|endofprompt|>` (upstream's
    instruct_list), the prompt text of upstream's inference_instruct2; one written in full is taken as it is."""
    case = next(c for c in json.loads((golden / "tokenizer.json").read_text())["cases"] if "<|endofprompt|>" in c["text"])
    fe = cv3_pipeline.frontend
    assert fe.instruction_tokens("Please speak slowly and warmly.") == case["ids"]
    assert fe.instruction_tokens(case["text"]) == case["ids"]


def test_text_given_to_the_llm_is_upstreams(cases, cv3_pipeline):
    """The request's text ids and each voice's prompt text (system prompt and <|endofprompt|> included)."""
    for c in cases.values():
        a = c["arrays"]
        assert [list(s) for s in cv3_pipeline.frontend.segments(c["text"])] == [list(a["text_token"].ravel())]
        assert list(cv3_pipeline.voices[c["voice"]].prompt_text_tokens) == list(a["prompt_text_token"].ravel())


def _decode(p, names: list[str], cases) -> list[tuple[list[int], list[np.ndarray]]]:
    """The named cases decoded together in one batch: each row's tokens and its log-softmax at every step."""
    llm = p.llm
    seqs = []
    for i, name in enumerate(names):
        a, v = cases[name]["arrays"], p.voices[cases[name]["voice"]]
        q = llm.sequence(a["text_token"].ravel().astype(np.int64), v.prompt_text_tokens, v.llm_prompt_speech_tokens,
                         np.random.default_rng(i), owner=[])
        seqs.append(q)
    sample = llm._sample

    def recording(rows, logits):
        for q, row in zip(rows, logits):
            q.owner.append(log_softmax(row[None].astype(np.float32))[0])
        sample(rows, logits)

    llm._sample = recording
    try:
        batch = llm.prefill(seqs)
        while batch is not None:
            batch = llm.keep(batch, [i for i, q in enumerate(batch.seqs) if not q.done])
            if batch is not None:
                llm.step(batch)
    finally:
        llm._sample = sample
    return [(q.tokens, q.owner) for q in seqs]


def _check_llm(case, tokens, logps) -> float:
    a = case["arrays"]
    picks = list(a["llm_picks"].ravel())
    stop = case["stop_token"]
    assert tokens == (picks[:-1] if stop is not None else picks), case["name"]
    assert len(logps) == case["llm_steps"]
    err = 0.0
    for step, key in ((0, "llm_logp_step0"), (1, "llm_logp_step1"), (2, "llm_logp_step2"),
                      (case["last_logp_step"], "llm_logp_last")):
        err = max(err, float(np.abs(logps[step] - a[key].ravel()).max()))
    assert err < LOGP_TOL, case["name"]
    return err


@pytest.mark.parametrize("name", WHOLE_TEXT)
def test_llm_picks_and_log_probabilities_alone(name, cases, cv3_pipeline):
    [(tokens, logps)] = _decode(cv3_pipeline, [name], cases)
    report(f"llm {name} log-probabilities", _check_llm(cases[name], tokens, logps))


def test_llm_in_a_batch_of_8_as_alone(cases, cv3_pipeline):
    names = [*WHOLE_TEXT, "short_whole", "market_stream"]  # rows stop at 80, 149, 197 and 314 steps
    results = _decode(cv3_pipeline, names, cases)
    err = max(_check_llm(cases[n], *r) for n, r in zip(names, results))
    report("llm batch of 8 log-probabilities", err)


def test_silent_runs_past_five_do_not_reach_the_flow(cases):
    from cosyvoice_server.convert.convert import MAX_SILENT_RUN, SILENT_TOKENS

    dropped = 0
    for c in cases.values():
        a = c["arrays"]
        picks = list(a["llm_picks"].ravel())
        spoken = picks[:-1] if c["stop_token"] is not None else picks
        kept, _ = drop_silence(spoken, 0, frozenset(SILENT_TOKENS), MAX_SILENT_RUN)
        last = len(c["flow_calls"]) - 1
        assert kept == list(a[f"flow{last}_token"].ravel()), c["name"]
        dropped += len(spoken) - len(kept)
    assert dropped > 0  # the golden requests exercise the rule


def _flow_chunks(p, cases) -> list[tuple[FlowChunk, np.ndarray, str]]:
    ratio = p.manifest.token_mel_ratio
    out = []
    for c in cases.values():
        a, v = c["arrays"], p.voices[c["voice"]]
        for k, call in enumerate(c["flow_calls"]):
            tokens = a[f"flow{k}_token"].ravel().astype(np.int64)
            context = 0 if call["finalize"] else p.manifest.flow.pre_lookahead_tokens
            prompt = len(v.prompt_speech_tokens)
            chunk = FlowChunk(tokens=np.concatenate([v.prompt_speech_tokens, tokens]), token_len=prompt + len(tokens) - context,
                              context_len=context, streaming=call["streaming"], prompt_frames=prompt * ratio, offset_frames=0,
                              embedding=v.embedding, prompt_mel=v.prompt_mel)
            out.append((chunk, a[f"flow{k}_mel"].reshape(80, -1), f"{c['name']} flow{k}"))
    return out


def test_every_flow_call_alone_and_all_in_one_batch(cases, cv3_pipeline):
    p = cv3_pipeline
    calls = _flow_chunks(p, cases)
    assert {c.streaming for c, _, _ in calls} == {True, False}
    alone = [p.flow.run([c])[0] for c, _, _ in calls]
    together = p.flow.run([c for c, _, _ in calls])
    for (c, want, what), a, b in zip(calls, alone, together):
        assert a.shape == want.shape, what
        assert np.abs(a - want).max() < MEL_TOL, what
        assert np.abs(b - a).max() < MEL_TOL, what
    report("flow every call (alone)", max(float(np.abs(a - w).max()) for (_, w, _), a in zip(calls, alone)))
    report("flow every call (one batch)", max(float(np.abs(b - w).max()) for (_, w, _), b in zip(calls, together)))


def test_the_vocoders_fixed_noise_is_upstreams_draw(golden, cv3_model):
    """convert builds flow then vocoder as upstream's yaml does, so the source buffers drawn at construction
    are upstream's, value for value."""
    with np.load(golden / "hift_source.npz") as src:
        want = src["sine_waves"]
    noise = np.load(cv3_model / "hift_noise.npy", mmap_mode="r")
    assert noise.shape == (300 * 24000, 9)
    assert np.array_equal(noise[: len(want)], want)


def test_every_vocoder_call_alone_and_batched(cases, cv3_pipeline):
    p = cv3_pipeline
    calls = [(c["arrays"][f"hift{k}_mel"].reshape(80, -1), c["arrays"][f"hift{k}_speech"].ravel(), call["finalize"])
             for c in cases.values() for k, call in enumerate(c["hift_calls"])]
    assert {f for _, _, f in calls} == {True, False}
    rng = np.random.default_rng(0)
    items = [VocoderInput(mel, p.vocoder.noise(mel.shape[1], rng), None) for mel, _, _ in calls]
    alone = [p.vocoder.run([i])[0][0] for i in items]
    together = [w for w, _ in p.vocoder.run(items + items[:3])][: len(items)]
    look_right = p.manifest.streaming.look_right_frames * p.manifest.hop_samples
    for (mel, want, final), a, b in zip(calls, alone, together):
        # a non-final call returns the audio of all but the look-right frames: the start of the final run's
        assert len(want) == len(a) - (0 if final else look_right)
        assert np.abs(a[: len(want)] - want).max() < WAV_TOL
        assert np.abs(a - b).max() < WAV_TOL
    report("vocoder every call", max(float(np.abs(a[: len(w)] - w).max()) for (_, w, _), a in zip(calls, alone)))


def test_a_clips_prompt_mel_is_upstreams(golden, cv3_pipeline):
    from cosyvoice_server.voices import spectral

    m = cv3_pipeline.manifest
    assert m.prompt_encoders.mel_fmax is None  # CosyVoice3's feat_extractor: fmax null
    with np.load(golden / "feat.npz") as f:
        clip, want = f["clip_24k"].ravel(), f["speech_feat"].reshape(-1, 80)
    mel = spectral.prompt_mel(clip, m.sample_rate, hop=m.hop_samples, n_mels=m.flow.mel_bins, fmax=m.sample_rate / 2)
    assert mel.shape == want.shape
    err = float(np.abs(mel - want).max())
    assert err < 1e-4
    report("prompt mel (fmax null)", err)


def _streamed_calls(p, cases, name) -> list[tuple[FlowChunk, np.ndarray]]:
    """A streamed case's flow calls as the scheduler makes them: each returns only the frames after what the
    earlier chunks returned (their tokens less the look-ahead context); the want is upstream's mel from there."""
    c = cases[name]
    a, v = c["arrays"], p.voices[c["voice"]]
    ratio, prompt = p.manifest.token_mel_ratio, len(v.prompt_speech_tokens)
    out, offset = [], 0
    for k, call in enumerate(c["flow_calls"]):
        tokens = a[f"flow{k}_token"].ravel().astype(np.int64)
        context = 0 if call["finalize"] else p.manifest.flow.pre_lookahead_tokens
        chunk = FlowChunk(tokens=np.concatenate([v.prompt_speech_tokens, tokens]), token_len=prompt + len(tokens) - context,
                          context_len=context, streaming=call["streaming"], prompt_frames=prompt * ratio,
                          offset_frames=offset * ratio, embedding=v.embedding, prompt_mel=v.prompt_mel)
        out.append((chunk, a[f"flow{k}_mel"].reshape(80, -1)[:, offset * ratio:]))
        offset = len(tokens) - context
    return out


@pytest.mark.parametrize("drop_after", [None, 1])
def test_streamed_flow_computes_new_frames_only_and_matches_upstream(drop_after, cases, cv3_pipeline):
    """Each streamed segment's chunks through the incremental DiT (a cache per segment, the voice's prompt states
    kept), the three segments' chunks batched together; with the cache dropped after the first chunk the later
    ones re-run their prefix. Every chunk is upstream's mel."""
    p = cv3_pipeline
    assert p.flow.incremental is not None and p.manifest.flow.incremental.encoder_chunk_tokens is None
    segments = {n: _streamed_calls(p, cases, n) for n in ("river_stream", "lamp_stream", "market_stream")}
    caches = {n: p.flow.new_cache() for n in segments}
    err = 0.0
    for k in range(max(len(s) for s in segments.values())):
        batch = [(n, s[k]) for n, s in segments.items() if k < len(s)]
        for n, (chunk, _) in batch:
            chunk.cache = caches[n]
        mels = p.flow.run([chunk for _, (chunk, _) in batch])
        for (n, (chunk, want)), mel in zip(batch, mels):
            assert mel.shape == want.shape, (n, k)
            err = max(err, float(np.abs(mel - want).max()))
            if chunk.streaming and drop_after is None:
                assert caches[n].frames > 0  # the next chunk starts after the frames kept here
        if drop_after == k + 1:
            for cache in caches.values():
                cache.release()
    assert err < MEL_TOL
    assert p.flow.ledger.used == p.flow.prompt_cache_bytes  # the segments' caches went back; the voices' states stay
    report(f"flow streamed new frames only{' (cache dropped)' if drop_after else ''}", err)
