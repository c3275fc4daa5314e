"""Start-up measurements of how the flow and vocoder stages scale with their batch on this device.

Each cost is one run of the stage per row on a first streamed chunk's frames (the estimator with its guidance
rows) or half of them (the vocoder, which scales as plainly), after a warm-up run: a second or two of start-up
at CosyVoice2-0.5B's size on CPU (the start-up phase batch_probe).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..engine.flow import VocoderInput
from ..engine.pipeline import Pipeline
from ..streaming import seams_of
from .batching import paying_batch


def _timed(run: Callable[[], object]) -> float:
    run()
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def flow_cost(p: Pipeline, b: int) -> float:
    """One estimator step over `b` first chunks (the most frequent and most urgent flow work)."""
    m = p.manifest
    frames = m.streaming.first_hop_tokens * m.token_mel_ratio
    rng = np.random.default_rng(0)
    bins = m.flow.mel_bins

    def arr(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    feed = {"x": arr(2 * b, bins, frames), "mask": np.ones((2 * b, 1, frames), np.float32), "mu": arr(2 * b, bins, frames),
            "t": np.full(2 * b, 0.5, np.float32), "spks": arr(2 * b, bins), "cond": arr(2 * b, bins, frames),
            "streaming": np.ones(2 * b, np.int64)}
    return _timed(lambda: p.flow.estimator.run(None, feed))


def vocoder_cost(p: Pipeline, b: int) -> float:
    m = p.manifest
    frames = m.streaming.first_hop_tokens * m.token_mel_ratio // 2
    rng = np.random.default_rng(0)
    seams = seams_of(m.streaming.seams, m.streaming.mel_cache_frames, m.streaming.look_right_frames, m.hop_samples)
    mel, cache_source = seams.mel(None, rng.standard_normal((m.flow.mel_bins, frames)).astype(np.float32), False, 1.0)
    items = [VocoderInput(mel, p.vocoder.noise(frames, rng), cache_source) for _ in range(b)]
    return _timed(lambda: p.vocoder.run(items))


def measure(p: Pipeline, limit: int) -> dict[str, tuple[int, dict[int, float]]]:
    """stage -> (its paying batch up to `limit`, seconds per batch size tried)."""
    return {"flow": paying_batch(lambda b: flow_cost(p, b), limit),
            "vocoder": paying_batch(lambda b: vocoder_cost(p, b), limit)}
