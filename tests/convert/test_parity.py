"""The converted model against upstream CosyVoice2's own PyTorch inference, same random weights.

Stage by stage (LLM logits and greedy tokens, flow mel streaming and not, HiFT with its seams), batched
and alone, then end to end through the HTTP API. Tolerances: 1e-4 max abs (fp32); the measured errors
are printed (`pytest -s`) and recorded in the README's parity table.
"""

from __future__ import annotations

import asyncio
import io

import httpx
import numpy as np
import pytest
import soundfile as sf
from reference import log_mel

from cosyvoice_server.engine.flow import FlowChunk, VocoderInput
from cosyvoice_server.streaming import ChunkPlanner

TOL = 1e-4
TEXT = "Hello world, this is a small test of speech synthesis."


def report(what: str, err: float) -> None:
    print(f"\nPARITY {what}: max abs {err:.2e}")


def _text_tokens(pipeline, text: str) -> list[int]:
    segs = pipeline.frontend.segments(text)
    assert len(segs) == 1
    return segs[0].tolist()


def test_frontend_tokens_match_upstream_qwen_tokenizer(pipeline, checkpoint):
    from transformers import AutoTokenizer

    from cosyvoice_server.convert.tokens import special_tokens

    tok = AutoTokenizer.from_pretrained(str(checkpoint / "CosyVoice-BlankEN"))
    tok.add_special_tokens(special_tokens("cosyvoice2"))
    for text in (TEXT, "[breath] The quick brown fox? <strong>Yes</strong>."):
        assert _text_tokens(pipeline, text) == tok([text])["input_ids"][0]


@pytest.mark.parametrize("speaker", ["spk_a", "spk_b"])  # SFT embedding only; a saved zero-shot prompt
def test_llm_logits_under_teacher_forcing(pipeline, reference, speaker, monkeypatch):
    text = _text_tokens(pipeline, TEXT)
    spk = reference.speaker(speaker)
    forced = np.random.default_rng(1).integers(0, 6561, 30).tolist()
    want = reference.teacher_forced_logits(text, spk, forced)

    got = []
    llm = pipeline.llm

    def record(seqs, logits):  # instead of sampling: keep the logits, feed the forced token
        got.append(logits[0].copy())
        seqs[0].tokens.append(forced[len(got) - 1] if len(got) <= len(forced) else 0)

    monkeypatch.setattr(llm, "_sample", record)
    v = pipeline.voices[speaker]
    seq = llm.sequence(np.asarray(text), v.prompt_text_tokens, v.prompt_speech_tokens, np.random.default_rng(0), None)
    batch = llm.prefill([seq])
    for _ in forced:
        llm.step(batch)
    err = float(np.abs(np.stack(got) - want).max())
    report(f"LLM logits ({speaker}, {len(forced) + 1} steps)", err)
    assert err <= TOL


def _engine_greedy(pipeline, texts, speakers):
    llm = pipeline.llm
    seqs = []
    for text, speaker in zip(texts, speakers):
        v = pipeline.voices[speaker]
        seqs.append(llm.sequence(np.asarray(text), v.prompt_text_tokens, v.prompt_speech_tokens, np.random.default_rng(0), None))
    batch = llm.prefill(seqs)
    while batch is not None:
        llm.step(batch)
        batch = llm.keep(batch, [i for i, q in enumerate(batch.seqs) if not q.done])
    return [q.tokens for q in seqs]


def test_greedy_tokens_identical_alone_and_in_a_batch_of_8(pipeline, reference):
    words = TEXT.split()
    texts = [_text_tokens(pipeline, " ".join(words[: 2 + i])) for i in range(8)]
    speakers = ["spk_a", "spk_b"] * 4
    want = [reference.tokens(t, reference.speaker(s)) for t, s in zip(texts, speakers)]
    assert all(len(w) >= 2 * len(t) for w, t in zip(want, texts))  # min_len = 2 x text tokens
    assert _engine_greedy(pipeline, texts[:1], speakers[:1]) == want[:1]
    assert _engine_greedy(pipeline, texts, speakers) == want


def _chunk(pipeline, tokens, speaker, offset, end, final):
    v = pipeline.voices[speaker]
    ctx = 0 if final else 3
    p = len(v.prompt_speech_tokens)
    return FlowChunk(np.concatenate([v.prompt_speech_tokens, np.asarray(tokens[: end + ctx], np.int64)]), p + end, ctx,
                     not final, 2 * p, 2 * offset, v.embedding, v.prompt_mel)


# (speaker, tokens, offset, end, final): streamed chunks with context, a final chunk, a whole utterance
CASES = [("spk_a", 90, 0, 25, False), ("spk_b", 90, 33, 83, False), ("spk_a", 90, 75, 90, True),
         ("spk_b", 61, 0, 61, True), ("spk_a", 140, 25, 75, False), ("spk_b", 40, 0, 40, True),
         ("spk_a", 77, 0, 77, True), ("spk_b", 130, 83, 127, False)]


def test_flow_mel_streaming_and_not_alone_and_in_a_batch_of_8(pipeline, reference):
    rng = np.random.default_rng(2)
    chunks, want, all_tokens = [], [], []
    for speaker, n, offset, end, final in CASES:
        tokens = rng.integers(0, 6561, n).tolist()
        all_tokens.append(tokens)
        chunks.append(_chunk(pipeline, tokens, speaker, offset, end, final))
        ctx = 0 if final else 3
        mel = reference.flow_mel(tokens[: end + ctx], reference.speaker(speaker), streaming=not final, finalize=final)
        want.append(mel[:, 2 * offset:])
    alone = [pipeline.flow.run([c])[0] for c in chunks]
    batched = pipeline.flow.run(chunks)
    errs = {"streaming": 0.0, "non-streaming": 0.0, "batch vs alone": 0.0}
    for (case, a, b, w) in zip(CASES, alone, batched, want):
        assert a.shape == w.shape
        key = "non-streaming" if case[4] else "streaming"
        errs[key] = max(errs[key], float(np.abs(a - w).max()))
        errs["batch vs alone"] = max(errs["batch vs alone"], float(np.abs(a - b).max()))
    for k, e in errs.items():
        report(f"flow mel {k}", e)
        assert e <= TOL
    # the chunk masks matter: the same chunk without them is another mel
    speaker, _, offset, end, _ = CASES[1]
    full_context = reference.flow_mel(all_tokens[1][: end + 3], reference.speaker(speaker), streaming=False, finalize=False)
    assert np.abs(alone[1] - full_context[:, 2 * offset:]).max() > 100 * TOL


def _segment_chunks(pipeline, tokens: list[int], speaker: str, cache) -> list[FlowChunk]:
    """A streamed segment's flow calls as upstream's tts loop makes them (hop 25 + prompt pad, doubling to 100)."""
    s = pipeline.manifest.streaming
    v = pipeline.voices[speaker]
    planner = ChunkPlanner(s.first_hop_tokens, s.max_hop_tokens, s.hop_growth, 3, len(v.prompt_speech_tokens), True)
    out = []
    while (span := planner.next(len(tokens), True)) is not None:
        chunk = _chunk(pipeline, tokens, speaker, span.offset, span.end, span.final)
        chunk.cache = cache
        out.append(chunk)
    return out


@pytest.mark.parametrize("budget", ["ample", "dropped mid-segment"])
def test_streamed_segments_computed_incrementally_match_upstream_every_chunk(pipeline, reference, budget):
    """Each streamed chunk computes only the frames after the segment's cache; every chunk's mel is upstream's
    for that call (its full re-run over the prefix), alone and with three segments batched, and a segment whose
    cache finds no room goes on re-running with the same mel."""
    flow = pipeline.flow
    assert flow.incremental is not None
    rng = np.random.default_rng(5)
    segments = [(rng.integers(0, 6561, n).tolist(), speaker) for n, speaker in ((310, "spk_a"), (140, "spk_b"), (77, "spk_a"))]
    limit = flow.ledger.limit
    if budget != "ample":
        flow.ledger.limit = 200 * flow.cache_bytes_per_frame()  # room for the first chunks only
    try:
        alone = [[flow.run([c])[0] for c in _segment_chunks(pipeline, t, spk, flow.new_cache())] for t, spk in segments]
        plans = [_segment_chunks(pipeline, t, spk, flow.new_cache()) for t, spk in segments]
        caches = [p[0].cache for p in plans]
        batched: list[list[np.ndarray]] = [[] for _ in plans]
        dropped = set()  # segments whose cache went while streamed chunks were left
        for k in range(max(map(len, plans))):
            rows = [i for i, p in enumerate(plans) if k < len(p)]
            for i, mel in zip(rows, flow.run([plans[i][k] for i in rows])):
                batched[i].append(mel)
                if k == 0:  # the first chunk's complete chunks are kept, and only those, the encoder's too
                    assert caches[i].frames == plans[i][0].token_len * 2 // 50 * 50 or caches[i].closed
                    assert caches[i].closed or caches[i].encoder.tokens * 2 == caches[i].frames
                if caches[i].closed and k + 1 < len(plans[i]) and plans[i][k + 1].streaming:
                    dropped.add(i)
    finally:
        flow.ledger.limit = limit
    assert flow.ledger.used == 0  # every segment's last chunk gave its memory back
    assert all(c.closed for c in caches)
    assert bool(dropped) == (budget != "ample")
    err = {"alone": 0.0, "batched": 0.0}
    for (tokens, speaker), a, b, plan in zip(segments, alone, batched, plans):
        spk = reference.speaker(speaker)
        for mel_a, mel_b, c in zip(a, b, plan):
            end = c.token_len - len(pipeline.voices[speaker].prompt_speech_tokens)
            want = reference.flow_mel(tokens[: end + c.context_len], spk, streaming=c.streaming, finalize=not c.streaming)
            want = want[:, c.offset_frames:]
            assert mel_a.shape == want.shape == mel_b.shape
            err["alone"] = max(err["alone"], float(np.abs(mel_a - want).max()))
            err["batched"] = max(err["batched"], float(np.abs(mel_b - want).max()))
    for k, e in err.items():
        report(f"flow mel streamed incrementally ({k}, cache {budget})", e)
        assert e <= TOL


def _without_incremental_encoder(model, tmp_path):
    """The model as convert wrote it before the encoder had an incremental graph: no `flow.incremental.encoder`."""
    import yaml

    old = tmp_path / "model"
    old.mkdir()
    for f in model.iterdir():
        if f.name != "model.yaml":
            (old / f.name).symlink_to(f)
    m = yaml.safe_load((model / "model.yaml").read_text())
    del m["flow"]["incremental"]["encoder"]
    (old / "model.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    return old


def test_streamed_chunks_through_the_incremental_encoder_are_a_model_without_its(pipeline, converted, tmp_path,
                                                                                  monkeypatch):
    """Three segments streamed side by side (caches of different lengths in every batch): the encoder runs over
    each chunk's tokens after the segment's settled ones, and every chunk's mel is the one a model without the
    incremental encoder computes (re-running the encoder over the prefix), within the parity tolerance."""
    from cosyvoice_server.engine.pipeline import Pipeline

    old = Pipeline(_without_incremental_encoder(converted, tmp_path), "cpu", "fp32")
    flow = pipeline.flow
    assert flow.incremental_encoder is not None and old.flow.incremental_encoder is None
    assert old.flow.incremental is not None  # the estimator still computes new frames only
    rng = np.random.default_rng(6)
    segments = [(rng.integers(0, 6561, n).tolist(), speaker) for n, speaker in ((260, "spk_b"), (140, "spk_a"), (90, "spk_b"))]
    fed = []  # per encoder run: (offset, token_len) per row
    real = flow.incremental_encoder
    monkeypatch.setattr(flow, "incremental_encoder", type("Spy", (), {"run": lambda self, out, feed: (
        fed.append(list(zip(feed["offset"].tolist(), feed["token_len"].tolist()))), real.run(out, feed))[1]})())
    mels: dict[str, list[list[np.ndarray]]] = {}
    for name, p in (("incremental", pipeline), ("re-run", old)):
        plans = [_segment_chunks(p, t, spk, p.flow.new_cache()) for t, spk in segments]
        mels[name] = [[] for _ in plans]
        for k in range(max(map(len, plans))):
            rows = [i for i, plan in enumerate(plans) if k < len(plan)]
            for i, mel in zip(rows, p.flow.run([plans[i][k] for i in rows])):
                mels[name][i].append(mel)
        assert p.flow.ledger.used == 0
    assert any(len({o for o, _ in batch}) > 1 for batch in fed)  # rows of different cache lengths together
    assert max(o for batch in fed for o, _ in batch) >= 100  # later chunks start after whole chunks of tokens
    err = max(float(np.abs(a - b).max()) for x, y in zip(mels["incremental"], mels["re-run"]) for a, b in zip(x, y))
    report("flow mel streamed, incremental encoder vs re-run encoder", err)
    assert err <= TOL


def test_a_voices_prompt_states_are_computed_once_and_every_later_chunk_is_upstreams(pipeline, reference, monkeypatch):
    """A voice with a 3 s-like prompt: its first streamed segment keeps the prompt's settled states, and the
    voice's later segments (two at once) start their first chunk after them. Every chunk's mel is still
    upstream's for that call."""
    from dataclasses import replace

    import torch

    flow = pipeline.flow
    rng = np.random.default_rng(11)
    n = 60  # (60 - 3 look-ahead) // 25 = 2 encoder chunks = 100 frames that no segment changes
    tokens, mel, emb = rng.integers(0, 6561, n), rng.standard_normal((2 * n, 80)).astype(np.float32) * 0.5, \
        rng.standard_normal(192).astype(np.float32)
    monkeypatch.setitem(pipeline.voices, "long", replace(pipeline.voices["spk_b"], prompt_speech_tokens=tokens,
                                                         prompt_mel=mel, embedding=emb))
    spk = {"embedding": torch.from_numpy(emb)[None], "prompt_token": torch.from_numpy(tokens.astype(np.int32))[None],
           "prompt_feat": torch.from_numpy(mel)[None]}
    assert flow.prompt_frames(n) == 100
    offsets, tokens_from = [], []  # the first frame each masked run computes, the first token its encoder does
    for name, into in (("incremental", offsets), ("incremental_encoder", tokens_from)):
        real = getattr(flow, name)
        monkeypatch.setattr(flow, name, type("Spy", (), {"run": lambda self, out, feed, real=real, into=into: (
            into.append(int(feed["offset"][0])), real.run(out, feed))[1]})())
    segments = [rng.integers(0, 6561, k).tolist() for k in (140, 77, 100)]
    plans = [_segment_chunks(pipeline, t, "long", flow.new_cache()) for t in segments]
    got: list[list[np.ndarray]] = [[flow.run([c])[0] for c in plans[0]], [], []]
    assert flow.prompt_cache_bytes >= 100 * flow.cache_bytes_per_frame()  # the prompt's frames (and conv inputs)
    offsets.clear()
    tokens_from.clear()
    for k in range(max(len(plans[1]), len(plans[2]))):
        rows = [i for i in (1, 2) if k < len(plans[i])]
        for i, m in zip(rows, flow.run([plans[i][k] for i in rows])):
            got[i].append(m)
    assert offsets[0] == 100  # the later segments' first chunks began after the voice's prompt states
    assert tokens_from[0] == 50  # and their encoder after the prompt's settled tokens
    assert flow.ledger.used == flow.prompt_cache_bytes > 0  # the segments gave theirs back; the voice's stays
    err = 0.0
    for t, chunks, mels in zip(segments, plans, got):
        for c, m in zip(chunks, mels):
            end = c.token_len - n
            want = reference.flow_mel(t[: end + c.context_len], spk, streaming=c.streaming, finalize=not c.streaming)
            assert m.shape == want[:, c.offset_frames:].shape
            err = max(err, float(np.abs(m - want[:, c.offset_frames:]).max()))
    report("flow mel streamed from a voice's kept prompt states", err)
    assert err <= TOL


def test_hift_whole_and_with_source_cache_alone_and_batched(pipeline, reference):
    rng = np.random.default_rng(3)
    h = pipeline.vocoder.harmonics
    items = []
    for frames, cached in ((40, 0), (40, 3840), (58, 3840), (40, 0), (23, 0)):
        mel = rng.standard_normal((80, frames)).astype(np.float32)
        items.append(VocoderInput(mel, rng.standard_normal((frames * 480, h)).astype(np.float32),
                                  rng.standard_normal(cached).astype(np.float32) * 0.1))
    batched = pipeline.vocoder.run(items)
    err = err_src = 0.0
    for it, (wav, src) in zip(items, batched):
        want_wav, want_src = reference.hift_run(it.mel, it.cache_source, it.noise)
        alone_wav, _ = pipeline.vocoder.run([it])[0]
        err = max(err, float(np.abs(wav - want_wav).max()), float(np.abs(alone_wav - want_wav).max()))
        err_src = max(err_src, float(np.abs(src - want_src).max()))
    report("HiFT waveform", err)
    report("HiFT source", err_src)
    assert err <= TOL and err_src <= TOL


# fp16 files against fp32 (ONNX Runtime CPU here; documented in the README). Random weights, so these are
# bounds for this check, not a promise for trained weights.
FP16_TOL = {"LLM logits": 1e-2, "flow mel": 0.15, "flow mel streamed": 0.15, "HiFT waveform": 2e-3}


def test_fp16_files_stay_within_the_documented_tolerance(converted, pipeline):
    from cosyvoice_server.engine.pipeline import Pipeline

    half = Pipeline(converted, "cpu", "fp16")
    rng = np.random.default_rng(4)
    v = pipeline.voices["spk_b"]
    errs = {}
    text = np.arange(12)
    logits = []
    for p in (pipeline, half):
        q = p.llm.sequence(text, v.prompt_text_tokens, v.prompt_speech_tokens, np.random.default_rng(0), None)
        got = []
        p.llm._sample = lambda seqs, lg, got=got: (got.append(lg[0].copy()), seqs[0].tokens.append(7))
        p.llm.prefill([q])
        logits.append(got[0])
        del p.llm._sample
    errs["LLM logits"] = float(np.abs(logits[0] - logits[1]).max())
    chunk = _chunk(pipeline, rng.integers(0, 6561, 80).tolist(), "spk_b", 0, 80, True)
    mel = pipeline.flow.run([chunk])[0]
    errs["flow mel"] = float(np.abs(half.flow.run([chunk])[0] - mel).max())
    # a streamed segment through each precision's incremental graphs (estimator and encoder), chunk by chunk
    tokens = rng.integers(0, 6561, 140).tolist()
    assert half.flow.incremental is not None and half.flow.incremental_encoder is not None
    streamed = [[p.flow.run([c])[0] for c in _segment_chunks(p, tokens, "spk_b", p.flow.new_cache())] for p in (pipeline, half)]
    errs["flow mel streamed"] = max(float(np.abs(a - b).max()) for a, b in zip(*streamed))
    item = VocoderInput(mel, rng.standard_normal((mel.shape[1] * 480, 9)).astype(np.float32), np.zeros(0, np.float32))
    errs["HiFT waveform"] = float(np.abs(half.vocoder.run([item])[0][0] - pipeline.vocoder.run([item])[0][0]).max())
    for k, e in errs.items():
        report(f"fp16 vs fp32 {k}", e)
        assert e <= FP16_TOL[k]


PARAGRAPHS = [
    "Hello world, this is a small test of speech synthesis.",
    "I paid $12.50 on Jan 3, 2024 at 10:30am. The quick brown fox jumps over the lazy dog? " * 4 + "Done!",
    '"Is it streaming?" she asked. "Yes," he said; chunk by chunk: 25 tokens, then 50, then 100.',
    "今天是2024年1月3日，气温25度。我们（在北京）测试【语音合成】的流式输出！" * 3 + "好的",
    "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐，笑容如花儿般绽放。",
]


@pytest.mark.parametrize("text", PARAGRAPHS)
def test_text_frontend_segments_as_upstream_text_normalize(pipeline, checkpoint, text):
    """Upstream's CosyVoiceFrontEnd.text_normalize steps with its own frontend_utils and wetext."""
    from functools import partial

    from cosyvoice.utils import frontend_utils as fu
    from inflect import engine
    from transformers import AutoTokenizer
    from wetext import Normalizer

    from cosyvoice_server.convert.tokens import special_tokens

    tok = AutoTokenizer.from_pretrained(str(checkpoint / "CosyVoice-BlankEN"))
    tok.add_special_tokens(special_tokens("cosyvoice2"))
    encode = lambda t: tok([t])["input_ids"][0]  # noqa: E731  (QwenTokenizer.encode)
    t = text.strip()
    if fu.contains_chinese(t):
        t = Normalizer(lang="zh", operator="tn", remove_erhua=False).normalize(t).replace("\n", "")
        t = fu.remove_bracket(fu.replace_corner_mark(fu.replace_blank(t)).replace(".", "。").replace(" - ", "，"))
        import re

        t = re.sub(r"[，,、]+$", "。", t)
        want = fu.split_paragraph(t, partial(encode), "zh", token_max_n=80, token_min_n=60, merge_len=20, comma_split=False)
    else:
        t = fu.spell_out_number(Normalizer(lang="en", operator="tn").normalize(t), engine())
        want = fu.split_paragraph(t, partial(encode), "en", token_max_n=80, token_min_n=60, merge_len=20, comma_split=False)
    want = [w for w in want if not fu.is_only_punctuation(w)]
    assert pipeline.frontend.texts(text) == want
    assert [s.tolist() for s in pipeline.frontend.segments(text)] == [encode(w) for w in want]
