"""CosyVoice2's speech-token sampling: repetition-aware top-p/top-k (RAS).

Top-k then nucleus sampling per row; if the sampled token already appears too often in the last
`win_size` tokens (>= win_size * tau_r times), the row re-samples from the full distribution, which
is what keeps the LLM out of repetition loops.
"""

from __future__ import annotations

import numpy as np


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sample_tokens(
    logits: np.ndarray,
    histories: list[list[int]],
    rngs: list[np.random.Generator],
    allow_eos: np.ndarray,
    eos: int,
    top_k: int,
    top_p: float,
    win_size: int,
    tau_r: float,
) -> np.ndarray:
    """logits[B,V] -> token per row. Tokens past eos (CosyVoice2's fill tokens) are never sampled;
    eos only where allow_eos (the minimum length has been reached)."""
    logits = logits[:, : eos + 1].astype(np.float64, copy=True)
    logits[~allow_eos, eos] = -np.inf
    k = min(top_k, logits.shape[1])
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    top_logits = np.take_along_axis(logits, top, axis=1)
    order = np.argsort(-top_logits, axis=1)
    top = np.take_along_axis(top, order, axis=1)
    probs = _softmax(np.take_along_axis(top_logits, order, axis=1))
    # Nucleus: keep the smallest prefix whose mass reaches top_p (always at least one token).
    keep = np.cumsum(probs, axis=1) - probs < top_p
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum(axis=1, keepdims=True)
    # Inverse-CDF draws, one uniform per row from the row's own generator (per-request reproducibility).
    u = np.array([rng.random() for rng in rngs])
    pick = np.minimum((np.cumsum(probs, axis=1) < u[:, None]).sum(axis=1), k - 1)
    out = top[np.arange(len(top)), pick]
    for i, rng in enumerate(rngs):
        recent = histories[i][-win_size:]
        if recent and recent.count(int(out[i])) >= win_size * tau_r:
            cdf = np.cumsum(_softmax(logits[i]))
            out[i] = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1)
    return out
