"""The streaming resampler's edges: what it returns when there is nothing to return, and what it accepts.
Its output is float32 mono at every step, the format the stream's encoder takes."""
from __future__ import annotations

import numpy as np

from cosyvoice_server.audio import StreamResampler


def test_nothing_in_nothing_out_as_float32() -> None:
    r = StreamResampler(24000, 16000)
    for out in (r.chunk(np.zeros(0, np.float32)), r.close()):
        assert (out.dtype, out.shape) == (np.float32, (0,))


def test_any_float_input_comes_out_float32_mono() -> None:
    """A float64 tone (as numpy computes one) is taken as is; the output keeps the tone's level."""
    sr = 24000
    tone = 0.5 * np.sin(2 * np.pi * 440.0 * np.arange(sr) / sr)  # float64
    r = StreamResampler(sr, 48000)
    out = np.concatenate([r.chunk(tone), r.close()])
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(len(out) - 48000) <= 480
    assert abs(np.abs(out[4800:-4800]).max() - 0.5) < 0.01
