"""Uploaded reference clips: decoded by their content, checked against what a voice prompt needs.

Everything here is pure (bytes in, samples or a ClipRejected out) so each refusal is testable alone;
the HTTP layer turns a ClipRejected into a 400 in OpenAI's error shape. It runs in the extraction worker
(voices/worker.py), under that process's address-space limit, never in the server process.

Only the containers named in SUPPORTED reach libsndfile: the first bytes must be a RIFF/RF64 WAVE, fLaC,
OggS or MP3 (ID3 tag or frame sync) header, so none of libsndfile's other parsers (AIFF, CAF, AU, PAF,
SD2, ...) ever reads an upload.
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
# Studio rates go up to 192 kHz; above it a clip is 30 s of a few hundred MB for nothing a voice needs.
MAX_SAMPLE_RATE = 192_000
# Float WAV may go a little over full scale; far beyond it the samples are not audio (1e19 overflowed the
# fbank's float32 power into an infinite speaker embedding).
MAX_PEAK = 4.0  # +12 dBFS
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
# Other containers named in the refusal instead of "corrupt" (their parsers never run).
_FOREIGN = {b"FORM": "AIFF", b"caff": "CAF", b".snd": "AU", b"\x1aE\xdf\xa3": "WebM/Matroska", b"0&\xb2u": "WMA"}
# Media types that declare nothing about the format.
_UNDECLARED = {"", "application/octet-stream", "audio/*", "binary/octet-stream"}


class ClipRejected(ValueError):
    """A clip that cannot become a voice; `code` is the stable machine-readable reason."""

    def __init__(self, message: str, code: str, param: str = "audio") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    def __reduce__(self):  # raised in the extraction worker, re-raised in the server
        return type(self), (self.message, self.code, self.param)


@dataclass(frozen=True)
class ClipFacts:
    """What the voice record keeps of the clip (what the extraction worker sends back with the voice)."""
    sample_rate: int
    samples: int
    format: str

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate


@dataclass(frozen=True)
class Clip:
    audio: np.ndarray  # float32 mono in [-1, 1] at its own rate
    sample_rate: int
    format: str  # one of SUPPORTED, from the content

    @property
    def seconds(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def facts(self) -> ClipFacts:
        return ClipFacts(self.sample_rate, len(self.audio), self.format)


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
    content = sniff(data)
    if content not in SUPPORTED:
        if content is not None:
            raise ClipRejected(f"{content} audio is not supported; send {', '.join(SUPPORTED)}.",
                               "unsupported_audio_format")
        raise ClipRejected("The audio could not be decoded: it is corrupt or not WAV, FLAC, MP3 or Ogg audio.",
                           "invalid_audio")
    try:
        info = sf.info(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, ValueError):
        info = None
    if info is None or _CONTENT.get(info.format) != content:
        raise ClipRejected(f"The audio could not be decoded: it starts as {content.upper()} but is corrupt.",
                           "invalid_audio")
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
    if info.samplerate > MAX_SAMPLE_RATE:
        raise ClipRejected(f"The clip is sampled at {info.samplerate} Hz; the most a voice clip may have is "
                           f"{MAX_SAMPLE_RATE} Hz (e.g. `ffmpeg -i clip.wav -ar 48000 clip48k.wav`).", "sample_rate_too_high")
    _check_length(info.frames / info.samplerate)  # from the header, before decoding a long file
    try:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True,
                              frames=int((MAX_SECONDS + 1) * info.samplerate))
    except (sf.LibsndfileError, RuntimeError, ValueError):
        raise ClipRejected("The audio could not be decoded: its data is corrupt.", "invalid_audio") from None
    audio = np.ascontiguousarray(audio[:, 0])
    if not np.isfinite(audio).all():
        raise ClipRejected("The audio holds non-finite samples (NaN or infinity); it is corrupt.", "invalid_audio")
    if (peak := float(np.abs(audio).max(initial=0.0))) > MAX_PEAK:
        raise ClipRejected(f"The audio's samples reach {peak:.3g} times full scale (the most is {MAX_PEAK:g}); it is "
                           "not a recording at a usable level: normalize it to [-1, 1].", "audio_out_of_range")
    _check_length(len(audio) / rate)  # headers (mp3 especially) may misstate the length
    if loudest_dbfs(audio, rate) < SILENCE_DBFS:
        raise ClipRejected("The clip is silent (no 20 ms of it is louder than "
                           f"{SILENCE_DBFS:g} dBFS); send a recording of the voice.", "audio_silent")
    return Clip(audio, int(rate), content)


def sniff(data: bytes) -> str | None:
    """The container its first bytes announce: one of SUPPORTED, another container's name, or None."""
    head = data[:12]
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if head[4:8] == b"ftyp":
        return "MP4/M4A"
    return _FOREIGN.get(head[:4])


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
