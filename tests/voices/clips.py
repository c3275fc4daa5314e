"""Reference clips for the voice tests, made in memory: a voiced, syllable-like signal (a glottal-pulse
harmonic series under a slow amplitude envelope) so the silence and level checks see speech-like audio."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf


def speech_like(seconds: float = 5.0, rate: int = 24000, channels: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 25 * np.sin(2 * np.pi * 0.7 * t)  # a gliding pitch
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    syllables = np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5  # ~6 syllables a second
    audio = 0.25 * voiced * syllables / np.abs(voiced).max() + 0.003 * rng.standard_normal(len(t))
    audio = audio.astype(np.float32)
    return np.stack([audio] * channels, axis=1) if channels > 1 else audio


def encode(audio: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def wav(seconds: float = 5.0, rate: int = 24000, **kw) -> bytes:
    return encode(speech_like(seconds, rate, **kw), rate)
