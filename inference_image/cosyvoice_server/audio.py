"""Audio encoding for the speech API: whole files and incremental streams, for every response format.

`pcm` is 16-bit little-endian mono with no header (OpenAI's definition, at the model's 24 kHz), and
`wav` is that behind a RIFF header, both written here. The compressed formats use FFmpeg's encoders
and muxers through PyAV (its wheels bundle FFmpeg with LAME, libopus, the native AAC and FLAC
encoders): mp3, aac as ADTS frames, opus in Ogg, flac. A stream is muxed into a sink that cannot
seek, so each container writes only what needs no going back: a streamed `wav` header carries
0xFFFFFFFF sizes ("until end of stream"), a streamed FLAC header leaves the total sample count 0
("unknown", as the FLAC format allows), an MP3 stream has no Xing/LAME header. A whole file is
muxed into a seekable buffer, so its headers are complete.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field

import av
import numpy as np
import soundfile as sf


@dataclass(frozen=True)
class AudioFormat:
    media_type: str
    muxer: str | None = None  # FFmpeg muxer; None for wav/pcm, which are written here
    codec: str | None = None
    bit_rate: int | None = None
    options: dict[str, str] = field(default_factory=dict)


FORMATS = {
    "mp3": AudioFormat("audio/mpeg", "mp3", "libmp3lame", 64_000),
    # Ogg holds packets until a page is full or this much audio (µs) is buffered; 0.1 s keeps the
    # stream close to the generated audio at ~1 % page overhead.
    "opus": AudioFormat("audio/ogg", "ogg", "libopus", 32_000, {"page_duration": "100000"}),
    "aac": AudioFormat("audio/aac", "adts", "aac", 64_000),
    "flac": AudioFormat("audio/flac", "flac", "flac"),
    "wav": AudioFormat("audio/wav"),
    "pcm": AudioFormat("audio/pcm"),
}


def to_int16(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")


def wav_stream_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    block = channels * bits // 8
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data" + struct.pack("<I", 0xFFFFFFFF)
    )


class _Sink:
    """Write-only, not seekable: PyAV then muxes as for a pipe, and the bytes can leave at once."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class _FFmpegEncoder:
    def __init__(self, fmt: AudioFormat, sample_rate: int, out) -> None:
        # flush_packets: hand each muxed packet to `out` now instead of filling a 32 KiB buffer first
        self.container = av.open(out, "w", format=fmt.muxer, options={"flush_packets": "1", **fmt.options})
        self.stream = self.container.add_stream(fmt.codec, rate=sample_rate, layout="mono")
        if fmt.bit_rate:
            self.stream.bit_rate = fmt.bit_rate
        self.sample_rate = sample_rate
        self.pts = 0

    def write(self, audio: np.ndarray) -> None:
        if not len(audio):
            return
        # the same 16-bit samples as pcm and wav, so flac is exactly them and every format quantizes alike
        frame = av.AudioFrame.from_ndarray(to_int16(audio)[None, :], format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self.pts
        self.pts += len(audio)
        # PyAV converts sample format and frame size to what the encoder takes
        self.container.mux(self.stream.encode(frame))

    def close(self) -> None:
        self.container.mux(self.stream.encode(None))
        self.container.close()


def encode(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """One whole file, headers complete."""
    if fmt == "pcm":
        return to_int16(audio).tobytes()
    buf = io.BytesIO()
    if fmt == "wav":
        sf.write(buf, audio, sample_rate, format="WAV", subtype="PCM_16")
        return buf.getvalue()
    enc = _FFmpegEncoder(FORMATS[fmt], sample_rate, buf)
    enc.write(audio)
    enc.close()
    return buf.getvalue()


class StreamEncoder:
    """Encodes successive float chunks into the bytes of one stream; each call returns what is ready."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.fmt = fmt
        self.sample_rate = sample_rate
        self._sink = _Sink()
        self._ffmpeg = _FFmpegEncoder(FORMATS[fmt], sample_rate, self._sink) if FORMATS[fmt].muxer else None

    def header(self) -> bytes:
        if self.fmt == "wav":
            return wav_stream_header(self.sample_rate)
        return self._sink.take()  # what the muxer wrote on opening (e.g. FLAC's stream header)

    def chunk(self, audio: np.ndarray) -> bytes:
        if self._ffmpeg is None:
            return to_int16(audio).tobytes()
        self._ffmpeg.write(audio)
        return self._sink.take()

    def close(self) -> bytes:
        if self._ffmpeg is None:
            return b""
        self._ffmpeg.close()
        return self._sink.take()


class StreamResampler:
    """Converts successive float chunks from one sample rate to another (FFmpeg's libswresample through
    PyAV), keeping its filter state across chunks so the seams are inaudible. `close` returns the
    samples its filter still holds."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=out_rate)

    def _run(self, frame: av.AudioFrame | None) -> np.ndarray:
        parts = [f.to_ndarray()[0] for f in self._resampler.resample(frame)]
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)

    def chunk(self, audio: np.ndarray) -> np.ndarray:
        if not len(audio):
            return np.zeros(0, np.float32)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, np.float32)[None, :], format="flt", layout="mono")
        frame.sample_rate = self.in_rate
        return self._run(frame)

    def close(self) -> np.ndarray:
        return self._run(None)
