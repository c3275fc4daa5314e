"""Uploaded reference clips: decoded by their content, checked against what a voice prompt needs.

Everything here is pure (bytes in, samples or a ClipRejected out) so each refusal is testable alone;
the HTTP layer turns a ClipRejected into a 400 in OpenAI's error shape.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from .features import MAX_SECONDS  # upstream's limit on prompt audio
from .features import TOKENIZER_RATE as MIN_SAMPLE_RATE  # the encoders' rate: upsampling adds no voice

# Shorter than a second gives the speech tokenizer too little to describe a voice.
MIN_SECONDS = 1.0
# The loudest 20 ms window must reach this: below it the clip is silence or hum, not a voice.
SILENCE_DBFS = -50.0
SUPPORTED = ("wav", "flac", "mp3", "ogg")

# libsndfile's container names -> ours. WAVEX is WAV with a channel mask, RF64 is WAV over 4 GB.
_CONTENT = {"WAV": "wav", "WAVEX": "wav", "RF64": "wav", "FLAC": "flac", "MP3": "mp3", "OGG": "ogg"}
_EXTENSIONS = {".wav": "wav", ".wave": "wav", ".flac": "flac", ".mp3": "mp3", ".ogg": "ogg", ".oga": "ogg",
               ".opus": "ogg",
               # audio a user might send that this server cannot take: named, so the message can say so
               ".m4a": "m4a", ".mp4": "mp4", ".aac": "aac", ".webm": "webm", ".wma": "wma", ".aif": "aiff",
               ".aiff": "aiff", ".amr": "amr", ".caf": "caf"}
_MEDIA_TYPES = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
                "audio/x-pn-wav": "wav", "audio/flac": "flac", "audio/x-flac": "flac", "audio/mpeg": "mp3",
                "audio/mp3": "mp3", "audio/mpeg3": "mp3", "audio/x-mpeg-3": "mp3", "audio/ogg": "ogg",
                "audio/opus": "ogg", "audio/vorbis": "ogg", "application/ogg": "ogg"}
# Media types that declare nothing about the format.
_UNDECLARED = {"", "application/octet-stream", "audio/*", "binary/octet-stream"}


class ClipRejected(ValueError):
    """A clip that cannot become a voice; `code` is the stable machine-readable reason."""

    def __init__(self, message: str, code: str, param: str = "audio") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


@dataclass(frozen=True)
class Clip:
    audio: np.ndarray  # float32 mono in [-1, 1] at its own rate
    sample_rate: int
    format: str  # one of SUPPORTED, from the content

    @property
    def seconds(self) -> float:
        return len(self.audio) / self.sample_rate


def declared_format(filename: str | None, media_type: str | None) -> str | None:
    """What the upload says it is (extension first, then Content-Type); None when it says nothing."""
    ext = os.path.splitext(filename or "")[1].lower()
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    kind = (media_type or "").split(";")[0].strip().lower()
    if kind in _UNDECLARED:
        return None
    if kind in _MEDIA_TYPES:
        return _MEDIA_TYPES[kind]
    return kind  # e.g. audio/aac or text/plain: not one we take


def decode(data: bytes, filename: str | None = None, media_type: str | None = None) -> Clip:
    """The clip's samples, or ClipRejected saying what is wrong with it and what to send instead."""
    if not data:
        raise ClipRejected("The audio file is empty.", "empty_file")
    declared = declared_format(filename, media_type)
    if declared is not None and declared not in SUPPORTED:
        raise ClipRejected(f"Audio declared as {declared!r} is not supported; send {', '.join(SUPPORTED)}.",
                           "unsupported_audio_format")
    try:
        info = sf.info(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, ValueError):
        raise ClipRejected("The audio could not be decoded: it is corrupt or not WAV, FLAC, MP3 or Ogg audio.",
                           "invalid_audio") from None
    content = _CONTENT.get(info.format)
    if content is None:
        raise ClipRejected(f"{info.format} audio is not supported; send {', '.join(SUPPORTED)}.",
                           "unsupported_audio_format")
    if declared is not None and declared != content:
        named = f"named {os.path.splitext(filename or '')[1]}" if os.path.splitext(filename or "")[1] else f"sent as {media_type}"
        raise ClipRejected(f"The file is {named} but its content is {content.upper()}; send it under its own "
                           f"type (.{content}) or convert it.", "audio_type_mismatch")
    if info.channels != 1:
        raise ClipRejected(f"The clip has {info.channels} channels; send a mono recording of one speaker "
                           "(e.g. `ffmpeg -i clip.wav -ac 1 mono.wav`).", "audio_not_mono")
    if info.samplerate < MIN_SAMPLE_RATE:
        raise ClipRejected(f"The clip is sampled at {info.samplerate} Hz; voices need at least {MIN_SAMPLE_RATE} Hz "
                           "(record at 16 kHz or more; upsampling does not add the missing voice).", "sample_rate_too_low")
    _check_length(info.frames / info.samplerate)  # from the header, before decoding a long file
    try:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True,
                              frames=int((MAX_SECONDS + 1) * info.samplerate))
    except (sf.LibsndfileError, RuntimeError, ValueError):
        raise ClipRejected("The audio could not be decoded: its data is corrupt.", "invalid_audio") from None
    audio = np.ascontiguousarray(audio[:, 0])
    if not np.isfinite(audio).all():
        raise ClipRejected("The audio holds non-finite samples (NaN or infinity); it is corrupt.", "invalid_audio")
    _check_length(len(audio) / rate)  # headers (mp3 especially) may misstate the length
    if loudest_dbfs(audio, rate) < SILENCE_DBFS:
        raise ClipRejected("The clip is silent (no 20 ms of it is louder than "
                           f"{SILENCE_DBFS:g} dBFS); send a recording of the voice.", "audio_silent")
    return Clip(audio, int(rate), content)


def _check_length(seconds: float) -> None:
    if seconds > MAX_SECONDS:
        raise ClipRejected(f"The clip is {_shown_apart(seconds, MAX_SECONDS, 1)} s long; the limit is {MAX_SECONDS:g} s "
                           "(trim it to a few seconds of clean speech: 3-10 s works best).", "audio_too_long")
    if seconds < MIN_SECONDS:
        raise ClipRejected(f"The clip is {_shown_apart(seconds, MIN_SECONDS, 2)} s long; a voice needs at least "
                           f"{MIN_SECONDS:g} s of speech.", "audio_too_short")


def _shown_apart(value: float, limit: float, digits: int) -> str:
    """`value` with at least `digits` decimals and as many more as it takes not to read as `limit` (a 0.9994 s
    clip refused as "1.00 s long" would not say why)."""
    while float(shown := f"{value:.{digits}f}") == limit and digits < 6:
        digits += 1
    return shown


def loudest_dbfs(audio: np.ndarray, rate: int, window_s: float = 0.02) -> float:
    """RMS level of the loudest window, in dB relative to full scale (-inf for digital silence)."""
    n = max(1, int(rate * window_s))
    frames = audio[: len(audio) // n * n].reshape(-1, n) if len(audio) >= n else audio.reshape(1, -1)
    peak = float(np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1)).max())
    return 20 * np.log10(peak) if peak > 0 else float("-inf")
