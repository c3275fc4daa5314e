"""`speed` time-scales the mel spectrogram before the vocoder as upstream CosyVoice2 does:
F.interpolate(mel, size=int(T / speed), mode='linear'), i.e. half-pixel centres, clamped at the edges."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvoice_server.streaming import interpolate_mel


def ramp(frames: int) -> np.ndarray:
    """80 mel bins whose value is the frame index: interpolation shows up as exact fractional values."""
    return np.tile(np.arange(frames, dtype=np.float32), (80, 1))


@pytest.mark.parametrize(("frames", "speed", "expected"), [
    (5, 0.5, [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.25, 3.75, 4]),  # twice as long: source (d + 0.5) / 2 - 0.5
    (6, 2.0, [0.5, 2.5, 4.5]),        # twice as fast: half the frames, each between two
    (4, 0.8, [0, 0.7, 1.5, 2.3, 3]),  # int(4 / 0.8) = 5 frames
    (1, 2.0, [0.0]),                  # never fewer than one frame
    (2, 4.0, [0.5]),
])
def test_speed_stretches_by_linear_interpolation(frames: int, speed: float, expected: list[float]) -> None:
    out = interpolate_mel(ramp(frames), speed)
    assert out.dtype == np.float32 and out.shape[0] == 80
    np.testing.assert_allclose(out[0], np.asarray(expected, np.float32), atol=1e-6)
    assert np.all(out == out[0])  # every bin the same way


def test_interpolation_weights_neighbouring_frames() -> None:
    mel = np.zeros((80, 3), np.float32)
    mel[:, 1] = 1.0  # a single peak: stretched, it rises and falls linearly
    out = interpolate_mel(mel, 0.5)[0]
    np.testing.assert_allclose(out, [0, 0.25, 0.75, 0.75, 0.25, 0], atol=1e-6)
    assert out.max() <= 1.0 and out.min() >= 0.0


def test_normal_speed_returns_the_mel_untouched() -> None:
    mel = ramp(7)
    assert interpolate_mel(mel, 1.0) is mel
