"""CosyVoice2's speech-token sampling, as upstream main's `Qwen2LM.sampling_ids` + `ras_sampling`.

Per row: log-softmax over the whole output vocabulary (speech tokens, eos and the two fill tokens); while
the sequence is shorter than `min_len` the eos log-probability is -inf. Nucleus sampling then walks the
softmax sorted by probability (stable order) and takes tokens while the running sum of the probabilities
taken so far is below top_p AND fewer than top_k are taken, without renormalising before the cut, and
draws from what it took. If that token already occurs at least win_size x tau_r times in the last
win_size tokens, the row draws again from the whole distribution (repetition-aware sampling). The caller
stops a row on any token >= eos (upstream's `stop_token_ids`).
"""

from __future__ import annotations

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from unnormalised probabilities (torch.multinomial's contract)."""
    cdf = np.cumsum(probs, dtype=np.float64)
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(probs) - 1)


def nucleus(probs: np.ndarray, top_p: float, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and probabilities the nucleus takes from one row (descending, stable)."""
    order = np.argsort(-probs, kind="stable")
    sorted_p = probs[order]
    # Token i is taken while the float32 running sum of the tokens before it is below top_p (and i < top_k).
    below = np.concatenate([[0.0], np.cumsum(sorted_p[:-1], dtype=np.float32)]) < top_p
    n = min(top_k, len(probs) if below.all() else int(np.argmin(below)))
    return order[:n], sorted_p[:n]


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
    """logits[B,V] -> one token per row; each row draws from its own generator (per-request seeds)."""
    logp = log_softmax(logits.astype(np.float32))
    logp[~allow_eos, eos] = -np.inf
    probs = _softmax(logp)
    out = np.empty(len(logits), np.int64)
    for i, rng in enumerate(rngs):
        idx, p = nucleus(probs[i], top_p, top_k)
        tok = int(idx[_draw(p, rng)])
        recent = histories[i][-win_size:]
        if recent.count(tok) >= win_size * tau_r:
            tok = _draw(probs[i], rng)
        out[i] = tok
    return out
