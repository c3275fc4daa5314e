"""Audio encoding for the speech API: whole files and incremental streams.

`pcm` is 16-bit little-endian mono with no header (OpenAI's definition, at the model's 24 kHz). A
streamed `wav` starts with a header whose RIFF and data sizes are 0xFFFFFFFF, since the length is
unknown until the end; players and decoders treat that as "until end of stream".
"""

from __future__ import annotations

import io
import struct
import numpy as np
import soundfile as sf

# format name -> (libsndfile container, subtype, media type)
FORMATS = {
    "wav": ("WAV", "PCM_16", "audio/wav"),
    "pcm": ("RAW", "PCM_16", "audio/pcm"),
    "flac": ("FLAC", "PCM_16", "audio/flac"),
    "mp3": ("MP3", "MPEG_LAYER_III", "audio/mpeg"),
    "opus": ("OGG", "OPUS", "audio/ogg"),
}
STREAMABLE = ("wav", "pcm", "opus")


def to_int16(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")


def wav_stream_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    block = channels * bits // 8
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data" + struct.pack("<I", 0xFFFFFFFF)
    )


def encode(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    if fmt == "pcm":
        return to_int16(audio).tobytes()
    container, subtype, _ = FORMATS[fmt]
    buf = io.BytesIO()
    sf.write(buf, audio, sample_rate, format=container, subtype=subtype)
    return buf.getvalue()


class _AppendOnly:
    """A write-only sink for libsndfile that hands out bytes as soon as they are encoded."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        self.size += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.size  # stream containers (Ogg) never need to go back

    def tell(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        return b""

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class StreamEncoder:
    """Encodes successive float chunks into the bytes of one stream."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        if fmt not in STREAMABLE:
            raise ValueError(fmt)
        self.fmt = fmt
        self.sample_rate = sample_rate
        self._sink: _AppendOnly | None = None
        self._file: sf.SoundFile | None = None
        self._started = False

    def header(self) -> bytes:
        return wav_stream_header(self.sample_rate) if self.fmt == "wav" else b""

    def chunk(self, audio: np.ndarray) -> bytes:
        if self.fmt in ("wav", "pcm"):
            return to_int16(audio).tobytes()
        if self._file is None:
            self._sink = _AppendOnly()
            container, subtype, _ = FORMATS[self.fmt]
            self._file = sf.SoundFile(self._sink, "w", self.sample_rate, 1, format=container, subtype=subtype)
        self._file.write(audio)
        return self._sink.take()

    def close(self) -> bytes:
        if self._file is None:
            return b""
        self._file.close()
        return self._sink.take()

