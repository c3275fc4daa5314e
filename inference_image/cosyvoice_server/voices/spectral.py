"""The signal processing of upstream CosyVoice2's prompt frontend, in numpy, numerically as upstream's torch code.

- `resample`: torchaudio's `Resample` (windowed-sinc, Hann window, 6 zero crossings, rolloff 0.99), which
  upstream's `load_wav` applies to bring a clip to 16 kHz (tokens, speaker embedding) and 24 kHz (prompt mel).
  A different resampler (soxr, resampy) changes the prompt mel by far more than the parity tolerance.
- `whisper_log_mel`: openai-whisper's `log_mel_spectrogram(audio, n_mels=128)`, the speech tokenizer's input.
- `prompt_mel`: Matcha-TTS's `mel_spectrogram` with CosyVoice2's feat_extractor settings, the flow's prompt.

Sums run in float64 over upstream's float32 constants (windows, filters, resampling kernel), so the result is
within float32 rounding of upstream's. The mel filters are librosa's (Slaney scale and norm), computed here
with librosa's two float32 roundings: kaldi-native-fbank's librosa-mode banks differ from them by 5e-6
relative, enough to move the random stand-in tokenizer's tokens in the parity tests.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

WHISPER_RATE, WHISPER_N_FFT, WHISPER_HOP = 16000, 400, 160


# Outputs computed per step of `resample`: bounds its working memory (a [CHUNK, taps] gather, taps <= 2 * 73 + 2
# for 192 kHz -> 16 kHz) whatever the clip's length.
RESAMPLE_CHUNK = 4096


@lru_cache(maxsize=8)
def _resample_phases(orig: int, new: int, width_zeros: int = 6, rolloff: float = 0.99) -> tuple[np.ndarray, np.ndarray, int]:
    """torchaudio's `_get_sinc_resample_kernel` for rates already divided by their gcd, keeping of each of its
    `new` rows only the taps its window leaves non-zero: (kernel [new, 2 * width + 2], first tap of each row
    relative to its frame's start, width).

    torchaudio's row p spans `orig + 2 * width` input samples, but its window is zero beyond `width` samples
    of the output's position p * orig / new; a rate sharing no factor with the target (16001 Hz) made that
    [16000, 16015] doubles (2 GB), 200003 Hz [16000, 200155] (24 GB). These rows are [new, 2 * width + 2]."""
    base = min(orig, new) * rolloff
    width = math.ceil(width_zeros * orig / base)
    first = np.arange(new) * orig // new - width  # the taps of row p: input samples first[p] .. first[p] + 2 * width + 1
    kernel = np.empty((new, 2 * width + 2), np.float32)
    for start in range(0, new, RESAMPLE_CHUNK):  # float64 temporaries of a block of rows, not of the whole table
        phase = np.arange(start, min(start + RESAMPLE_CHUNK, new))
        idx = (first[phase, None] + np.arange(2 * width + 2)[None, :]) / orig
        # torchaudio divides an integer arange in the default dtype (float32) before adding the float64 grid
        t = (-phase / new).astype(np.float32).astype(np.float64)[:, None] + idx
        t = np.clip(t * base, -width_zeros, width_zeros)
        window = np.cos(t * math.pi / width_zeros / 2) ** 2
        t = t * math.pi
        with np.errstate(invalid="ignore", divide="ignore"):
            rows = np.where(t == 0, 1.0, np.sin(t) / t)
        kernel[phase] = rows * window * (base / orig)
    return kernel, first, width


def resample(audio: np.ndarray, orig: int, new: int) -> np.ndarray:
    """`torchaudio.transforms.Resample(orig, new)(audio)` for mono float32 audio, in memory bounded by the
    ratio of the rates (not by their greatest common divisor) and time linear in the clip's length."""
    if orig == new:
        return audio.astype(np.float32)
    g = math.gcd(orig, new)
    o, n = orig // g, new // g
    kernel, first, width = _resample_phases(o, n)
    length = math.ceil(n * len(audio) / o)
    out = np.empty(length, np.float32)
    # output j = k * n + p reads input samples k * o + first[p] + (0 .. taps - 1); x is padded by `width` at the start
    taps = kernel.shape[1]
    last = (length - 1) // n * o + int(first.max()) + taps + width if length else 0
    x = np.pad(audio.astype(np.float64), (width, max(0, last - len(audio) - width)))
    rows = np.lib.stride_tricks.sliding_window_view(x, taps)
    for start in range(0, length, RESAMPLE_CHUNK):
        j = np.arange(start, min(start + RESAMPLE_CHUNK, length))
        p = j % n
        frames = rows[j // n * o + first[p] + width]
        out[start : start + len(j)] = np.einsum("ij,ij->i", frames, kernel[p].astype(np.float64))
    return out


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """librosa's Slaney mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log = f >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), (200.0 / 3) * m)


@lru_cache(maxsize=4)
def mel_filters(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """`librosa.filters.mel(sr=, n_fft=, n_mels=, fmin=, fmax=)` (Slaney, float32): [n_mels, n_fft // 2 + 1]."""
    freqs = np.fft.rfftfreq(n_fft, 1.0 / sr)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    ramps = edges[:, None] - freqs[None, :]
    diff = np.diff(edges)
    tri = np.maximum(0, np.minimum(-ramps[:-2] / diff[:-1, None], ramps[2:] / diff[1:, None])).astype(np.float32)
    enorm = 2.0 / (edges[2:] - edges[:-2])
    return (tri.astype(np.float64) * enorm[:, None]).astype(np.float32)


@lru_cache(maxsize=4)
def hann(n: int) -> np.ndarray:
    """torch.hann_window(n) (periodic), float32."""
    return (0.5 - 0.5 * np.cos(2 * math.pi * np.arange(n) / n)).astype(np.float32)


def _stft_power(y: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """|rfft|^2 of Hann-windowed frames of an already padded signal: [frames, n_fft // 2 + 1]."""
    frames = np.lib.stride_tricks.sliding_window_view(y.astype(np.float64), n_fft)[::hop]
    spec = np.fft.rfft(frames * hann(n_fft).astype(np.float64), axis=1)
    return spec.real**2 + spec.imag**2


def whisper_log_mel(audio16k: np.ndarray, n_mels: int = 128) -> np.ndarray:
    """openai-whisper's log_mel_spectrogram: [n_mels, len // 160], clamped to 8 (log10) below its peak, scaled."""
    pad = WHISPER_N_FFT // 2
    y = np.pad(audio16k, (pad, pad), mode="reflect")  # torch.stft(center=True, pad_mode="reflect")
    power = _stft_power(y, WHISPER_N_FFT, WHISPER_HOP)[:-1]  # whisper drops the last frame
    mel = mel_filters(WHISPER_RATE, WHISPER_N_FFT, n_mels, 0.0, WHISPER_RATE / 2).astype(np.float64) @ power.T
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)


def prompt_mel(audio: np.ndarray, sr: int = 24000, n_fft: int = 1920, hop: int = 480, n_mels: int = 80,
               fmin: float = 0.0, fmax: float = 8000.0) -> np.ndarray:
    """Matcha-TTS's mel_spectrogram (CosyVoice2's feat_extractor: center off, reflect padding of
    (n_fft - hop) / 2, magnitude with 1e-9 inside the root, log clamped at 1e-5): [frames, n_mels]."""
    pad = (n_fft - hop) // 2
    y = np.pad(audio, (pad, pad), mode="reflect")
    mag = np.sqrt(_stft_power(y, n_fft, hop) + 1e-9)
    mel = mel_filters(sr, n_fft, n_mels, fmin, fmax).astype(np.float64) @ mag.T
    return np.log(np.maximum(mel, 1e-5)).T.astype(np.float32)
