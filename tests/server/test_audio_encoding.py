"""The bytes players read: WAV header fields parsed by hand (libsndfile ignores some of them, players do not)."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf

from cosyvoice_server.audio import StreamEncoder, encode, to_int16

SR = 24000


def wav_fields(data: bytes) -> dict[str, int]:
    """The canonical 44-byte PCM WAV header, field by field."""
    riff, riff_size, wave, fmt, fmt_size = struct.unpack_from("<4sI4s4sI", data, 0)
    assert (riff, wave, fmt, fmt_size) == (b"RIFF", b"WAVE", b"fmt ", 16)
    tag, channels, rate, byte_rate, block_align, bits = struct.unpack_from("<HHIIHH", data, 20)
    chunk, data_size = struct.unpack_from("<4sI", data, 36)
    assert chunk == b"data"
    return {"riff_size": riff_size, "format": tag, "channels": channels, "rate": rate, "byte_rate": byte_rate,
            "block_align": block_align, "bits": bits, "data_size": data_size}


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_whole_wav_header_describes_24khz_mono_16bit() -> None:
    audio = tone(0.5)
    data = encode(audio, SR, "wav")
    h = wav_fields(data)
    # byte rate and block align decide how players seek and how long they say the file is
    assert (h["format"], h["channels"], h["rate"], h["bits"]) == (1, 1, SR, 16)
    assert (h["byte_rate"], h["block_align"]) == (SR * 2, 2)
    assert h["data_size"] == len(audio) * 2 == len(data) - 44
    assert h["riff_size"] == len(data) - 8
    assert np.max(np.abs(np.frombuffer(data[44:], "<i2") / 32768 - audio)) < 1e-4


def test_streamed_wav_header_has_the_same_format_and_open_ended_sizes() -> None:
    enc = StreamEncoder("wav", SR)
    audio = tone(0.2)
    data = enc.header() + enc.chunk(audio[:2400]) + enc.chunk(audio[2400:]) + enc.close()
    h = wav_fields(data)
    assert (h["format"], h["channels"], h["rate"], h["bits"]) == (1, 1, SR, 16)
    assert (h["byte_rate"], h["block_align"]) == (SR * 2, 2)
    assert h["riff_size"] == h["data_size"] == 0xFFFFFFFF  # length unknown until the end
    assert data[44:] == to_int16(audio).tobytes()
    assert len(encode(audio, SR, "wav")) == len(data)  # streamed and whole: the same layout


@pytest.mark.parametrize("value,sample", [(1.0, 32767), (-1.0, -32767), (2.5, 32767), (-7.0, -32767), (0.5, 16383)])
def test_pcm_is_little_endian_int16_clipped_at_full_scale(value: float, sample: int) -> None:
    data = encode(np.array([value], np.float32), SR, "pcm")
    assert data == struct.pack("<h", sample)


@pytest.mark.parametrize("fmt", ["flac", "opus"])
def test_compressed_formats_decode_to_the_same_length(fmt: str) -> None:
    audio = tone(0.5)
    if fmt == "opus":
        enc = StreamEncoder(fmt, 48000)
        data = enc.header() + enc.chunk(np.repeat(audio, 2)) + enc.close()
        decoded, sr = sf.read(io.BytesIO(data))
        assert sr == 48000 and abs(len(decoded) - 2 * len(audio)) <= 960
    else:
        decoded, sr = sf.read(io.BytesIO(encode(audio, SR, fmt)), dtype="float32")
        assert sr == SR and len(decoded) == len(audio)
        assert np.max(np.abs(decoded - audio)) < 1e-3


@pytest.mark.parametrize(("fmt", "subtype"), [("wav", "PCM_16"), ("flac", "PCM_16"), ("opus", "OPUS"), ("mp3", "MPEG_LAYER_III")])
def test_whole_files_use_the_codec_their_format_names(fmt: str, subtype: str) -> None:
    """An `opus` answer must be Opus in Ogg (libsndfile's default for Ogg would be Vorbis)."""
    info = sf.info(io.BytesIO(encode(tone(0.5), SR, fmt)))
    assert (info.subtype, info.samplerate, info.channels) == (subtype, SR, 1)


@pytest.mark.parametrize("fmt", ["mp3", "aac", "opus", "flac"])
def test_streamed_compressed_audio_leaves_chunk_by_chunk_and_decodes_to_its_length(fmt: str) -> None:
    """Each 0.2 s chunk yields bytes at once (no 32 KiB muxer buffer in front of the listener), and
    the stream's timestamps add up: the decoded stream is as long as the audio sent."""
    enc = StreamEncoder(fmt, SR)
    audio = tone(2.0)
    parts = [enc.header()]
    sizes = []
    for start in range(0, len(audio), 4800):
        data = enc.chunk(audio[start:start + 4800])
        sizes.append(len(data))
        parts.append(data)
    parts.append(enc.close())
    assert sum(1 for n in sizes if n > 0) >= len(sizes) - 2  # the codec's own lookahead may hold the first
    import av
    with av.open(io.BytesIO(b"".join(parts))) as container:
        decoded = sum(frame.samples for frame in container.decode(audio=0))
        rate = container.streams.audio[0].rate
    assert abs(decoded / rate - 2.0) < 0.08
