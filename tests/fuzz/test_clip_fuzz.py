"""Damaged uploads: truncated, bit-flipped and spliced WAV/FLAC/MP3/Ogg files must each decode or be refused
with a ClipRejected (a 400 with a reason), never raise anything else (a 500) or return unusable samples."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from cosyvoice_server.voices import clip


def source(fmt: str) -> bytes:
    t = np.arange(48000 * 3) / 48000
    audio = (0.3 * np.sin(2 * np.pi * 180 * t) * np.clip(np.sin(2 * np.pi * 3 * t), 0, None)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, audio, 48000, format=fmt)
    return buf.getvalue()


def damaged(data: bytes, rng: np.random.Generator) -> bytes:
    kind = rng.integers(4)
    b = bytearray(data)
    if kind == 0:  # cut short, often inside the header
        return bytes(b[: rng.integers(1, min(len(b), 4096))])
    if kind == 1:  # flipped bits, concentrated at the start where headers live
        for _ in range(rng.integers(1, 40)):
            i = int(min(len(b) - 1, rng.exponential(512)))
            b[i] ^= 1 << int(rng.integers(8))
        return bytes(b)
    if kind == 2:  # a random run of bytes overwritten
        i = int(rng.integers(len(b)))
        n = int(rng.integers(1, 256))
        b[i:i + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        return bytes(b)
    return bytes(b[: len(b) // 2]) + source("WAV")[44:2044]  # a foreign payload spliced in


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "MP3", "OGG"])
def test_damaged_files_decode_or_are_refused_with_a_reason(fmt):
    rng = np.random.default_rng(sum(map(ord, fmt)))
    good = source(fmt)
    refused = 0
    for _ in range(150):
        data = damaged(good, rng)
        try:
            c = clip.decode(data, f"clip.{fmt.lower()}")
        except clip.ClipRejected as exc:
            refused += 1
            assert exc.code and exc.message
            continue
        assert c.audio.dtype == np.float32 and c.audio.ndim == 1 and np.isfinite(c.audio).all()
        assert clip.MIN_SECONDS <= c.seconds <= clip.MAX_SECONDS and c.sample_rate >= clip.MIN_SAMPLE_RATE
    assert refused > 0  # the damage does reach the checks


def test_any_rate_and_level_decodes_or_is_refused_with_a_reason():
    """The audit's inputs: odd rates (16001, 200003 Hz), telephone and studio rates, huge, NaN and infinite
    float samples. Each decodes to a clip whose resampling is cheap, or is refused with a code."""
    from cosyvoice_server.voices import spectral

    rng = np.random.default_rng(27)
    rates = [8000, 16000, 16001, 44101, 192000, 200003] + [int(r) for r in rng.integers(15000, 210000, 6)]
    levels = [0.3, 3.9, 4.1, 1e19, np.nan, np.inf, -np.inf]
    codes = set()
    for rate in rates:
        for level in levels:
            audio = np.full(int(rate * 1.5), 0.1, np.float32)
            audio[:: max(1, rate // 100)] = level
            buf = io.BytesIO()
            sf.write(buf, audio, rate, format="WAV", subtype="FLOAT")
            try:
                c = clip.decode(buf.getvalue(), "clip.wav")
            except clip.ClipRejected as exc:
                codes.add(exc.code)
                continue
            assert clip.MIN_SAMPLE_RATE <= c.sample_rate <= clip.MAX_SAMPLE_RATE
            assert np.isfinite(c.audio).all() and np.abs(c.audio).max() <= clip.MAX_PEAK
            out = spectral.resample(c.audio, c.sample_rate, 16000)
            assert len(out) == int(np.ceil(len(c.audio) * 16000 / c.sample_rate)) and np.isfinite(out).all()
    assert codes == {"sample_rate_too_low", "sample_rate_too_high", "audio_out_of_range", "invalid_audio"}
