"""The pure pieces: chunk planning, stitching, batching decisions, sampling, the frontend, and the
engine's KV-cache re-layout (continuous batching must not change what a request computes)."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.engine.sampling import nucleus, sample_tokens
from cosyvoice_server.frontend import TextFrontend, normalize
from cosyvoice_server.scheduling.batching import should_dispatch
from cosyvoice_server.streaming import ChunkPlanner, Span, interpolate_mel, seam


def test_hops_start_at_first_hop_plus_lookahead_and_double_to_the_max():
    p = ChunkPlanner(first_hop=25, max_hop=100, growth=2, lookahead=3, prompt_tokens=0, stream=True)
    assert p.next(27, False) is None
    assert p.next(28, False) == Span(0, 25, False)
    spans = [p.next(n, False) for n in range(28, 400)]
    spans = [s for s in spans if s]
    assert spans[:4] == [Span(25, 75, False), Span(75, 175, False), Span(175, 275, False), Span(275, 375, False)]
    end = p.offset
    assert p.next(end + 3, True) == Span(end, end + 3, True)  # the end: one final chunk over what is left
    assert p.next(end + 3, True) is None


def test_first_hop_is_padded_to_align_with_the_prompt_and_state_is_per_request():
    # 17 prompt tokens: upstream pads the first hop by ceil(17/25)*25 - 17 = 8 tokens
    a = ChunkPlanner(25, 100, 2, 3, prompt_tokens=17, stream=True)
    b = ChunkPlanner(25, 100, 2, 3, prompt_tokens=17, stream=True)
    assert a.next(35, False) is None and a.next(36, False) == Span(0, 33, False)
    # only the first hop is padded: the next ones are 50, 100, ... from where the last one ended
    assert a.next(85, False) is None and a.next(86, False) == Span(33, 83, False)
    for n in range(87, 400):
        a.next(n, False)
    assert a.hop == 100 and b.hop == 25  # the upstream bug (#1798) shared and never reset this
    a.new_segment()  # the next segment starts at offset 0 with the request's hop, padded by it: 100 + 83
    assert a.next(185, False) is None and a.next(186, False) == Span(0, 183, False)
    # a streamed-text session restarts the hop for each segment: its first audio comes as soon as the first one's
    a.new_segment(restart_hop=True)
    assert a.next(35, False) is None and a.next(36, False) == Span(0, 33, False)
    assert a.next(86, False) == Span(33, 83, False)  # and grows again from there


def test_without_streaming_a_segment_is_one_final_chunk():
    p = ChunkPlanner(25, 100, 2, 3, prompt_tokens=0, stream=False)
    assert p.next(500, False) is None
    assert p.next(500, True) == Span(0, 500, True)


def test_seams_cross_fade_with_a_hamming_window_and_hold_back_the_cache():
    hop, cache = 480, 8
    window = np.hamming(2 * cache * hop)
    rng = np.random.default_rng(0)
    first = rng.standard_normal(30 * hop).astype(np.float32)
    mel1 = rng.standard_normal((80, 30)).astype(np.float32)
    out1, c = seam(first, first * 0.1, mel1, None, False, cache, hop, window)
    assert len(out1) == 22 * hop and c is not None
    np.testing.assert_array_equal(c.mel, mel1[:, -8:])
    np.testing.assert_array_equal(c.speech, first[-8 * hop:])
    np.testing.assert_array_equal(c.source, (first * 0.1)[-8 * hop:])  # the vocoder continues this source signal
    # the next chunk re-vocodes the 8 cached frames; their audio fades in over the held-back tail
    second = rng.standard_normal(18 * hop).astype(np.float32)
    out2, c2 = seam(second, second, np.zeros((80, 18), np.float32), c, True, cache, hop, window)
    assert c2 is None and len(out2) == 18 * hop  # nothing lost or doubled: 22 + 18 frames of audio
    np.testing.assert_array_equal(out1, first[: 22 * hop])
    n = cache * hop
    np.testing.assert_allclose(out2[:n], second[:n] * window[:n] + first[-n:] * window[n:], atol=1e-6)
    np.testing.assert_array_equal(out2[n:], second[n:])


def test_speed_interpolates_the_mel_like_torch_linear():
    mel = np.random.default_rng(1).standard_normal((80, 100)).astype(np.float32)
    assert interpolate_mel(mel, 2.0).shape == (80, 50)
    assert interpolate_mel(mel, 0.5).shape == (80, 200)
    assert interpolate_mel(mel, 1.3).shape == (80, int(100 / 1.3))
    assert interpolate_mel(mel, 1.0) is mel
    np.testing.assert_allclose(interpolate_mel(mel, 0.5)[:, 1], 0.75 * mel[:, 0] + 0.25 * mel[:, 1], atol=1e-6)


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


def test_sampling_masks_eos_under_min_length_and_stops_on_any_special_token():
    rng = [np.random.default_rng(i) for i in range(64)]
    logits = np.zeros((64, 13), np.float32)
    logits[:, 10] = 50.0  # eos (= index 10) dominates ...
    logits[:, 3] = 49.0
    allow = np.array([i % 2 == 0 for i in range(64)])
    out = sample_tokens(logits, [[] for _ in range(64)], rng, allow, eos=10, top_k=2, top_p=1.0, win_size=10, tau_r=0.1)
    assert np.all(out[~allow] == 3)  # eos masked before the minimum length
    assert np.mean(out[allow] == 10) > 0.5
    logits[:, 12] = 60.0  # a fill token past eos is sampled like any token (and stops the sequence upstream)
    out = sample_tokens(logits, [[] for _ in range(64)], rng, allow, eos=10, top_k=1, top_p=1.0, win_size=10, tau_r=0.1)
    assert np.all(out == 12)


def test_nucleus_takes_tokens_while_the_mass_before_them_is_below_top_p():
    probs = np.array([0.1, 0.5, 0.3, 0.05, 0.05], np.float32)
    idx, p = nucleus(probs, top_p=0.8, top_k=25)
    assert idx.tolist() == [1, 2]  # 0.5 < 0.8 -> take 0.3; then 0.8 is not < 0.8: stop (no renormalising first)
    assert nucleus(probs, top_p=0.85, top_k=25)[0].tolist() == [1, 2, 0]
    assert nucleus(probs, top_p=1.0, top_k=2)[0].tolist() == [1, 2]


def test_repetition_aware_sampling_escapes_a_loop():
    flat = np.zeros((1, 6), np.float32)

    def picks(history):
        return {int(sample_tokens(flat, [history], [np.random.default_rng(s)], np.array([True]), eos=5, top_k=1,
                                  top_p=1.0, win_size=10, tau_r=0.1)[0]) for s in range(50)}

    greedy = picks([])
    assert len(greedy) == 1  # top-1 always picks the same token ...
    assert len(picks(list(greedy) * 10)) > 1  # ... until it fills the window: then RAS samples the full distribution


def test_frontend_normalizes_and_segments_as_upstream():
    fe = TextFrontend(BUNDLED_MODEL / "tokenizer.json", max_tokens_per_segment=80)
    assert normalize("  Ｈｅｌｌｏ\u0007\n\n world！ ") == "Ｈｅｌｌｏ world！"
    assert fe.texts("I have 3 cats and 12 dogs") == ["I have three cats and twelve dogs."]  # wetext, then a stop
    assert "二零二四" in fe.texts("今天是2024年1月3日")[0]
    sentence = "This sentence has a handful of words in it. "
    n = len(fe.encode(sentence.strip()))
    texts = fe.texts(sentence * (200 // n) + "Short.")
    assert len(texts) >= 2 and texts[-1].endswith("in it. Short.")  # a short tail joins the segment before it
    # a segment closes once it has more than 60 tokens and the next sentence would take it past 80
    assert all(len(fe.encode(t)) > 60 and len(fe.encode(t)) + n > 80 for t in texts[:-1])
    assert fe.texts("?!") == []  # punctuation only: nothing to say
    raw = TextFrontend(BUNDLED_MODEL / "tokenizer.json", 80, text_frontend=False)
    assert raw.texts("I have 3 cats. And more.") == ["I have 3 cats. And more."]  # text_frontend=False: as is
    endless = fe.segments("word " * 600)  # no punctuation: upstream would keep it whole
    assert max(len(s) for s in endless) <= 400 and sum(map(len, endless)) == len(fe.encode(fe.texts("word " * 600)[0]))


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


def test_seam_output_stays_float32_and_fades_with_upstreams_hamming_halves():
    hop, cache = 480, 8
    window = np.hamming(2 * cache * hop)
    n = cache * hop
    first, c = seam(np.ones(20 * hop, np.float32), np.zeros(20 * hop, np.float32), np.zeros((80, 20), np.float32), None,
                    False, cache, hop, window)
    out, c2 = seam(-np.ones(9 * hop, np.float32), np.zeros(9 * hop, np.float32), np.zeros((80, 9), np.float32), c, True,
                   cache, hop, window)
    assert first.dtype == np.float32 and out.dtype == np.float32 and c2 is None
    np.testing.assert_allclose(out[:n], (window[n:] - window[:n]).astype(np.float32), atol=1e-6)  # old out, new in
    assert out[0] == pytest.approx(1.0 - 0.08, abs=1e-3) and out[n - 1] == pytest.approx(0.08 - 1.0, abs=1e-3)
    assert len(first) + len(out) == 20 * hop + 9 * hop - n  # the re-vocoded cache frames are not doubled


def test_a_segment_shorter_than_the_cache_still_ends_cleanly_and_the_next_starts_fresh():
    hop, cache = 480, 8
    window = np.hamming(2 * cache * hop)
    # a final chunk with no cache (a one-chunk segment, shorter than the cache): all of it, nothing held
    out, c = seam(np.full(3 * hop, 0.5, np.float32), np.zeros(3 * hop, np.float32), np.zeros((80, 3), np.float32), None,
                  True, cache, hop, window)
    assert c is None and len(out) == 3 * hop and np.all(out == 0.5)
