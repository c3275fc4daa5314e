"""The pure pieces: chunk planning, stitching, batching decisions, sampling, the frontend, and the
engine's KV-cache re-layout (continuous batching must not change what a request computes)."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.engine.sampling import sample_tokens
from cosyvoice_server.frontend import TextFrontend, normalize
from cosyvoice_server.scheduling.batching import should_dispatch
from cosyvoice_server.streaming import ChunkPlanner, Stitcher, stretch_mel


def test_hops_start_at_first_hop_plus_lookahead_and_double_to_the_max():
    p = ChunkPlanner(first_hop=25, max_hop=100, lookahead=3)
    assert p.next(27, False) is None
    assert p.next(28, False) == (0, 25)
    spans = [p.next(n, False) for n in range(28, 400)]
    spans = [s for s in spans if s]
    assert [b - a for a, b in spans][:4] == [50, 100, 100, 100]
    end = p.offset
    assert p.next(end + 3, True) == (end, end + 3)  # the end flushes whatever is left, lookahead included


def test_planner_flushes_the_tail_and_state_is_per_request():
    a, b = ChunkPlanner(25, 100, 3), ChunkPlanner(25, 100, 3)
    for n in range(200):
        a.next(n, False)
    assert a.hop == 100 and b.hop == 25  # the upstream bug (#1798) shared and never reset this
    assert b.next(10, True) == (0, 10)
    assert b.next(10, True) is None


def test_stitcher_keeps_exact_length_and_crossfades_the_seam():
    overlap = 960
    st = Stitcher(overlap)
    rng = np.random.default_rng(0)
    first = rng.standard_normal(4800).astype(np.float32)
    out1 = st.push(first, 0, False)
    assert len(out1) == 4800 - overlap
    # the next chunk re-synthesizes the held-back tail; identical audio must come out unchanged
    second = np.concatenate([first[-overlap:], rng.standard_normal(2400).astype(np.float32)])
    out2 = st.push(second, overlap, True)
    stream = np.concatenate([out1, out2])
    assert len(stream) == 4800 + 2400
    np.testing.assert_allclose(stream[:4800], first, atol=1e-6)


def test_stitcher_blends_differing_overlaps_smoothly():
    st = Stitcher(480)
    st.push(np.ones(960, np.float32), 0, False)
    out = st.push(np.concatenate([-np.ones(480, np.float32), -np.ones(480, np.float32)]), 480, True)
    seam = out[:480]
    assert seam[0] == pytest.approx(1.0, abs=1e-3) and seam[-1] == pytest.approx(-1.0, abs=1e-3)
    assert np.all(np.diff(seam) <= 1e-6)  # a ramp, not a jump


def test_stretch_mel_scales_frames():
    mel = np.random.default_rng(1).standard_normal((80, 100)).astype(np.float32)
    assert stretch_mel(mel, 2.0).shape == (80, 50)
    assert stretch_mel(mel, 0.5).shape == (80, 200)
    assert stretch_mel(mel, 1.0) is mel


@pytest.mark.parametrize("ready, max_batch, expected, waited, delay, go", [
    (0, 8, 5, 1.0, 0.005, False),   # nothing to run
    (1, 8, 0, 0.0, 0.005, True),    # idle server: a lone request goes at once
    (3, 8, 2, 0.0, 0.005, False),   # busy: others are upstream, wait a little
    (3, 8, 2, 0.006, 0.005, True),  # ... but never past the delay
    (8, 8, 5, 0.0, 0.005, True),    # full batch goes at once
    (3, 8, 2, 0.0, 0.0, True),      # delay 0: never wait
])
def test_dispatch_decision(ready, max_batch, expected, waited, delay, go):
    assert should_dispatch(ready, max_batch, expected, waited, delay) is go


def test_sampling_respects_min_length_and_top_k():
    rng = [np.random.default_rng(i) for i in range(64)]
    logits = np.zeros((64, 12), np.float32)
    logits[:, 10] = 50.0  # eos (= index 10) dominates ...
    logits[:, 11] = 100.0  # ... and a fill token beyond eos must never be sampled
    logits[:, 3] = 49.0
    allow = np.array([i % 2 == 0 for i in range(64)])
    out = sample_tokens(logits, [[] for _ in range(64)], rng, allow, eos=10, top_k=2, top_p=1.0, win_size=10, tau_r=0.1)
    assert np.all(out[~allow] == 3)  # eos masked before the minimum length
    assert np.all(out < 11)
    assert np.mean(out[allow] == 10) > 0.5


def test_repetition_aware_sampling_escapes_a_loop():
    flat = np.zeros((1, 6), np.float32)

    def picks(history):
        return {int(sample_tokens(flat, [history], [np.random.default_rng(s)], np.array([True]), eos=5, top_k=1,
                                  top_p=1.0, win_size=10, tau_r=0.1)[0]) for s in range(50)}

    greedy = picks([])
    assert len(greedy) == 1  # top-1 always picks the same token ...
    assert len(picks(list(greedy) * 10)) > 1  # ... until it fills the window: then RAS samples the full distribution


def test_frontend_normalizes_and_segments_at_sentences():
    fe = TextFrontend(BUNDLED_MODEL / "tokenizer.json", max_tokens_per_segment=60)
    assert normalize("  Ｈｅｌｌｏ\u0007\n\n world  ") == "Hello world"
    text = "First sentence is here. Second one follows! " + "A very long sentence without any stop " * 4
    segs = fe.segments(text)
    assert all(0 < len(s) <= 60 for s in segs) and len(segs) == 4
    assert fe.tokenizer.decode(segs[0].tolist()) == "First sentence is here. Second one follows!"  # short ones share
    spoken = "".join(fe.tokenizer.decode(s.tolist()) for s in segs)
    assert spoken.replace(" ", "") == normalize(text).replace(" ", "")  # nothing lost or repeated
    assert fe.segments("こんにちは。元気ですか？")  # CJK punctuation and multi-byte text


@pytest.fixture(scope="module")
def pipeline():
    return Pipeline(BUNDLED_MODEL, "cpu")


def _decode_alone(p, prompt, steps):
    seq = p.llm.sequence(prompt, np.zeros(0, np.int64), np.zeros(0, np.int64), np.random.default_rng(0), None)
    seq.min_len, seq.max_len = 10**6, 10**6
    batch = p.llm.prefill([seq])
    for _ in range(steps):
        p.llm.step(batch)
    return seq.tokens


def test_continuous_batching_joins_and_leaves_without_changing_results(pipeline):
    p = pipeline
    texts = [np.arange(5 + 7 * i, dtype=np.int64) % 200 for i in range(3)]
    alone = [_decode_alone(p, t, 12) for t in texts]

    seqs = []
    for t in texts:
        q = p.llm.sequence(t, np.zeros(0, np.int64), np.zeros(0, np.int64), np.random.default_rng(0), None)
        q.min_len, q.max_len = 10**6, 10**6
        seqs.append(q)
    batch = p.llm.prefill(seqs[:1])
    for _ in range(4):
        p.llm.step(batch)
    batch = p.llm.merge(batch, p.llm.prefill(seqs[1:]))  # two requests join a running one
    for _ in range(8):
        p.llm.step(batch)
    batch = p.llm.keep(batch, [1, 2])  # the first leaves; its padding columns go with it
    assert batch.mask.shape[1] == max(len(s.prompt) for s in seqs[1:]) + 8
    for _ in range(4):
        p.llm.step(batch)
    assert seqs[0].tokens == alone[0][: len(seqs[0].tokens)]
    assert seqs[1].tokens[:12] == alone[1][:12] and seqs[2].tokens[:12] == alone[2][:12]


def test_stitcher_crossfade_is_equal_power_and_output_stays_float32():
    st = Stitcher(481)
    first = st.push(np.ones(1000, np.float32), 0, False)
    out = st.push(-np.ones(1000, np.float32), 481, True)
    assert first.dtype == np.float32 and out.dtype == np.float32
    assert out[240] == pytest.approx(0.0, abs=1e-6)  # halfway through the seam both chunks weigh 0.5 (sin² + cos² = 1)
    assert len(first) + len(out) == 1000 + 1000 - 481


def test_stitcher_keeps_length_with_chunks_shorter_than_the_overlap_and_starts_clean_after_the_end():
    st = Stitcher(960)
    signal = np.arange(3000, dtype=np.float32)
    out = [st.push(signal[:500], 0, False)]  # shorter than the overlap: all held back
    out.append(st.push(signal[200:900], 300, False))  # re-synthesizes 300 samples of the held tail
    out.append(st.push(signal[600:3000], 300, True))
    stream = np.concatenate(out)
    np.testing.assert_allclose(stream, signal, atol=1e-3)
    fresh = st.push(np.full(10, 7, np.float32), 0, True)  # a new segment: nothing left over from the last
    np.testing.assert_array_equal(fresh, np.full(10, 7, np.float32))
