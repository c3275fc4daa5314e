"""Speech-token sampling as upstream CosyVoice2 defines it (ras_sampling): nucleus sampling over the
most likely tokens, and the repetition-aware fallback to the full distribution."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvoice_server.engine.sampling import _draw, nucleus, sample_tokens

EOS = 4  # tokens 0..3 are speech, 4 is end of speech (given a negligible score below)


def draw(probs: list[float], n: int = 4000, top_p: float = 1.0, top_k: int = 25,
         histories: list[list[int]] | None = None, win_size: int = 10, tau_r: float = 0.1) -> np.ndarray:
    """n independent draws (one row each, its own generator) from speech-token probabilities `probs`."""
    logits = np.log(np.array([*probs, 1e-30]))[None, :].repeat(n, axis=0)
    return sample_tokens(logits, histories or [[] for _ in range(n)], [np.random.default_rng(i) for i in range(n)],
                         np.ones(n, bool), eos=EOS, top_k=top_k, top_p=top_p, win_size=win_size, tau_r=tau_r)


def shares(tokens: np.ndarray) -> list[float]:
    return [float(np.mean(tokens == t)) for t in range(EOS + 1)]


def test_top_p_one_samples_the_whole_distribution() -> None:
    got = shares(draw([0.5, 0.3, 0.15, 0.05]))
    assert got == pytest.approx([0.5, 0.3, 0.15, 0.05, 0.0], abs=0.03)


def test_nucleus_keeps_the_smallest_prefix_reaching_top_p_and_renormalises() -> None:
    # 0.5 + 0.3 reaches 0.7: tokens 2 and 3 are cut, 0 and 1 keep their 5:3 ratio
    got = shares(draw([0.5, 0.3, 0.15, 0.05], top_p=0.7))
    assert got == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0, 0.0], abs=0.03)


def test_nucleus_smaller_than_the_top_token_keeps_that_token() -> None:
    """A top_p below the most likely token's probability must still sample it (never an empty set, never NaN)."""
    assert set(draw([0.6, 0.25, 0.1, 0.05], n=500, top_p=0.3).tolist()) == {0}
    assert set(draw([0.6, 0.25, 0.1, 0.05], n=500, top_p=0.55).tolist()) == {0}
    assert set(draw([0.6, 0.25, 0.1, 0.05], n=500, top_p=0.65).tolist()) == {0, 1}  # 0.6 < 0.65: one more


def test_top_k_limits_the_candidates() -> None:
    assert set(draw([0.3, 0.3, 0.2, 0.2], n=500, top_k=2).tolist()) == {0, 1}


def test_a_row_is_reproducible_from_its_own_generator() -> None:
    a = draw([0.4, 0.3, 0.2, 0.1], n=50, top_p=0.9)
    b = draw([0.4, 0.3, 0.2, 0.1], n=50, top_p=0.9)
    assert a.tolist() == b.tolist() and len(set(a.tolist())) > 1


# --- repetition-aware sampling: fall back when the pick repeats >= win_size * tau_r times in the window ---

PEAKED = [0.97, 0.01, 0.01, 0.01]  # top-1 always picks token 0


@pytest.mark.parametrize(("history", "falls_back"), [
    ([0], False),                    # once in the window: below 10 × 0.2 = 2
    ([0, 3, 0], True),               # twice: at the threshold, re-sampled from the full distribution
    ([0, 0] + [1] * 9, False),       # one of the two 0s slid out of the 10-token window
    ([0, 0] + [1] * 8, True),        # both still inside it
    ([1, 1, 1], False),              # repeats of other tokens do not matter
])
def test_repetition_fallback_at_its_exact_threshold(history: list[int], falls_back: bool) -> None:
    n = 400
    tokens = draw(PEAKED, n=n, top_k=1, histories=[list(history) for _ in range(n)], win_size=10, tau_r=0.2)
    if falls_back:
        # the full distribution: token 0 still most likely, the others now possible
        assert 0.9 < np.mean(tokens == 0) < 1.0 and set(tokens.tolist()) - {0}
    else:
        assert set(tokens.tolist()) == {0}


def test_confident_logits_sample_like_small_ones() -> None:
    """Softmax must not overflow for the large logits a confident LLM produces."""
    probs = np.array([0.5, 0.3, 0.15, 0.05, 1e-30])
    logits = (np.log(probs) + 800.0)[None, :].repeat(2000, axis=0)
    tokens = sample_tokens(logits, [[] for _ in range(2000)], [np.random.default_rng(i) for i in range(2000)],
                           np.ones(2000, bool), eos=EOS, top_k=25, top_p=0.7, win_size=10, tau_r=0.1)
    assert shares(tokens) == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0, 0.0], abs=0.04)
    fallback = sample_tokens(logits[:400], [[0]] * 400, [np.random.default_rng(i) for i in range(400)],
                             np.ones(400, bool), eos=EOS, top_k=1, top_p=1.0, win_size=10, tau_r=0.1)
    assert set(fallback.tolist()) == {0, 1, 2, 3}  # the full distribution, no NaN


def test_the_fallback_never_ends_speech_before_the_minimum_length() -> None:
    n = 400
    logits = np.log(np.array([0.4, 0.01, 0.01, 0.01, 0.57]))[None, :].repeat(n, axis=0)  # eos most likely
    tokens = sample_tokens(logits, [[0, 0]] * n, [np.random.default_rng(i) for i in range(n)], np.zeros(n, bool),
                           eos=EOS, top_k=1, top_p=1.0, win_size=10, tau_r=0.1)
    assert EOS not in tokens.tolist() and len(set(tokens.tolist())) > 1


def test_sampling_leaves_the_callers_logits_alone() -> None:
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1, 0.0001]]))
    before = logits.copy()
    sample_tokens(logits, [[]], [np.random.default_rng(0)], np.array([False]), eos=EOS, top_k=25, top_p=0.9,
                  win_size=10, tau_r=0.1)
    np.testing.assert_array_equal(logits, before)


def test_rows_of_very_different_scale_sample_independently() -> None:
    """One batch, one confident row and one flat one: each row's softmax is its own."""
    flat = np.log(np.array([0.25, 0.25, 0.25, 0.25, 1e-30]))
    rows = np.stack([flat, flat + 900.0] * 200)
    tokens = sample_tokens(rows, [[] for _ in range(400)], [np.random.default_rng(i) for i in range(400)],
                           np.ones(400, bool), eos=EOS, top_k=25, top_p=1.0, win_size=10, tau_r=0.1)
    assert set(tokens[0::2].tolist()) == set(tokens[1::2].tolist()) == {0, 1, 2, 3}


def test_the_fallback_may_end_speech_once_allowed() -> None:
    n = 400
    logits = np.log(np.array([0.57, 0.01, 0.01, 0.01, 0.4]))[None, :].repeat(n, axis=0)
    tokens = sample_tokens(logits, [[0, 0]] * n, [np.random.default_rng(i) for i in range(n)], np.ones(n, bool),
                           eos=EOS, top_k=1, top_p=1.0, win_size=10, tau_r=0.1)
    assert 0.3 < float(np.mean(tokens == EOS)) < 0.5  # the full distribution, eos included


# --- the nucleus cut exactly as upstream's nucleus_sampling: running sum < top_p AND count < top_k ---


def test_a_running_sum_exactly_at_top_p_closes_the_nucleus() -> None:
    """Upstream takes a token only while the sum before it is strictly below top_p: 0.5 + 0.25 == 0.75 stops."""
    idx, p = nucleus(np.array([0.5, 0.25, 0.25], np.float32), top_p=0.75, top_k=25)
    assert idx.tolist() == [0, 1] and p.tolist() == [0.5, 0.25]


def test_the_cut_can_fall_just_before_the_last_token_of_the_vocabulary() -> None:
    # 0.6 + 0.3 reaches 0.8 before the least likely token: it is never a candidate
    assert nucleus(np.array([0.6, 0.3, 0.1], np.float32), top_p=0.8, top_k=25)[0].tolist() == [0, 1]
    assert nucleus(np.array([0.1, 0.3, 0.6], np.float32), top_p=0.8, top_k=25)[0].tolist() == [2, 1]


def test_equally_likely_tokens_keep_their_vocabulary_order_at_the_top_k_cut() -> None:
    """Upstream sorts with stable=True: among tied tokens the lower ids are the candidates, the same every run."""
    probs = np.tile(np.array([0.5, 1.0, 0.5, 1.0], np.float32), 16)  # 64 tokens, 32 ties at each level
    probs /= probs.sum()
    idx, _ = nucleus(probs, top_p=1.0, top_k=20)
    assert idx.tolist() == list(range(1, 40, 2))  # the 20 lowest-id tokens of the more likely level
    idx, _ = nucleus(probs, top_p=1.0, top_k=40)
    assert idx.tolist() == list(range(1, 64, 2)) + list(range(0, 16, 2))


class _EdgeGenerator:
    """A generator at the lower edge of numpy's random() range [0, 1)."""

    def random(self) -> float:
        return 0.0


def test_a_zero_probability_token_is_never_drawn_even_at_the_generators_edge() -> None:
    """torch.multinomial never returns a category of probability 0; here token 0's logit underflows to 0."""
    logits = np.array([[-np.inf, 0.0, np.log(0.5), np.log(0.25), -30.0]], np.float32)
    fallback = sample_tokens(logits, [[1, 1]], [_EdgeGenerator()], np.ones(1, bool), eos=EOS, top_k=1, top_p=1.0,
                             win_size=10, tau_r=0.1)  # token 1 repeats: drawn again from the whole distribution
    assert fallback.tolist() == [1]


def test_a_long_tail_of_tiny_probabilities_keeps_its_share() -> None:
    """Two million tokens each below float32's resolution next to the top one hold 9 % of the mass together;
    the cumulative sum is kept in float64 (as torch.multinomial accumulates) so that they are still drawn."""
    probs = np.concatenate([[1.0], np.full(2_000_000, 5e-8)]).astype(np.float32)
    rng = np.random.default_rng(0)
    tail = sum(_draw(probs, rng) > 0 for _ in range(150))
    assert 5 <= tail <= 25  # 150 × 0.091 ≈ 14


def test_a_row_of_nan_logits_leaves_the_other_rows_of_the_batch_alone() -> None:
    """A numerically broken row (an fp16 overflow) must not raise and take its batch mates' requests down."""
    good = np.log(np.array([0.5, 0.3, 0.15, 0.05, 1e-30], np.float32))
    logits = np.stack([np.full(EOS + 1, np.nan, np.float32), good])
    for history in ([], [0] * 10):
        with np.errstate(invalid="ignore"):
            both = sample_tokens(logits, [list(history)] * 2, [np.random.default_rng(7), np.random.default_rng(8)],
                                 np.ones(2, bool), eos=EOS, top_k=25, top_p=0.8, win_size=10, tau_r=0.1)
        alone = sample_tokens(logits[1:], [list(history)], [np.random.default_rng(8)], np.ones(1, bool), eos=EOS,
                              top_k=25, top_p=0.8, win_size=10, tau_r=0.1)
        assert both[1] == alone[0]
