"""Decoding and checking uploaded clips (pure functions; the HTTP tests cover the same cases end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from clips import encode, speech_like, wav
from cosyvoice_server.voices import clip


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "MP3", "OGG"])
def test_each_supported_format_decodes_by_content(fmt):
    data = encode(speech_like(4.0, 48000), 48000, fmt)
    for filename in (f"clip.{fmt.lower()}", None, "clip"):  # named, unnamed, no extension
        c = clip.decode(data, filename, None)
        assert c.format == fmt.lower() and c.sample_rate == 48000
        assert c.audio.dtype == np.float32 and c.audio.ndim == 1
        assert c.seconds == pytest.approx(4.0, abs=0.1)


def test_wav_keeps_its_samples():
    audio = speech_like(2.0, 16000)
    c = clip.decode(encode(audio, 16000, subtype="FLOAT"), "a.wav", "audio/wav")
    np.testing.assert_array_equal(c.audio, audio)


def _refused(data: bytes, filename: str | None = "clip.wav", media_type: str | None = None) -> clip.ClipRejected:
    with pytest.raises(clip.ClipRejected) as info:
        clip.decode(data, filename, media_type)
    return info.value


@pytest.mark.parametrize("data, filename, media_type, code, says", [
    (b"", "a.wav", None, "empty_file", "empty"),
    (wav(40.0, 16000), "a.wav", None, "audio_too_long", "40.0 s"),
    (wav(0.4), "a.wav", None, "audio_too_short", "at least 1 s"),
    (wav(3.0, 8000), "a.wav", None, "sample_rate_too_low", "8000 Hz"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt " + b"\xff" * 200, "a.wav", None, "invalid_audio", "corrupt"),
    (b"this is not audio at all" * 50, "a.wav", None, "invalid_audio", "corrupt"),
    (encode(speech_like(3.0, 48000), 48000, "MP3"), "a.wav", None, "audio_type_mismatch", "named .wav but its content is MP3"),
    (wav(3.0), "a.flac", None, "audio_type_mismatch", "content is WAV"),
    (wav(3.0), None, "audio/mpeg", "audio_type_mismatch", "sent as audio/mpeg"),
    (wav(3.0), "a.m4a", None, "unsupported_audio_format", "'m4a'"),
    (wav(3.0), None, "text/plain", "unsupported_audio_format", "text/plain"),
    (wav(3.0, 48000, channels=2), "a.wav", None, "audio_not_mono", "-ac 1"),
    (encode(np.zeros(48000 * 3, np.float32), 48000), "a.wav", None, "audio_silent", "silent"),
    (encode(np.full(48000 * 3, 1e-4, np.float32), 48000), "a.wav", None, "audio_silent", "silent"),
    (encode(np.full(16000 * 2, np.nan, np.float32), 16000, subtype="FLOAT"), "a.wav", None, "invalid_audio", "NaN"),
    (encode(speech_like(3.0, 16000), 16000, "AIFF"), None, None, "unsupported_audio_format", "AIFF"),
    (wav(2.0, 200003), "a.wav", None, "sample_rate_too_high", "192000 Hz"),
    (encode(np.full(48000 * 2, 1e19, np.float32), 48000, subtype="FLOAT"), "a.wav", None, "audio_out_of_range", "1e+19"),
])
def test_bad_clips_are_refused_with_the_reason(data, filename, media_type, code, says):
    err = _refused(data, filename, media_type)
    assert err.code == code and err.param == "audio"
    assert says in err.message


def test_declared_types_that_say_nothing_are_not_mismatches():
    data = wav(2.0)
    for media_type in ("application/octet-stream", "", None, "audio/wav; codecs=1", "audio/x-wav"):
        assert clip.decode(data, None, media_type).format == "wav"
    assert clip.decode(data, "recording.take2.wav", "application/octet-stream").format == "wav"


def test_quiet_but_real_speech_passes_the_silence_check():
    audio = speech_like(3.0, 16000) * 0.05  # about -44 dBFS at its loudest
    assert clip.decode(encode(audio, 16000), "a.wav").format == "wav"
    assert clip.loudest_dbfs(np.zeros(100, np.float32), 16000) == float("-inf")


@pytest.mark.parametrize("seconds, says", [(0.9994, "0.999 s long"), (30.04, "30.04 s long")])
def test_a_refused_length_never_reads_as_the_limit(seconds, says):
    err = _refused(wav(seconds), "a.wav")
    assert says in err.message


@pytest.mark.parametrize("fmt", ["AIFF", "AU", "CAF", "W64"])
def test_other_containers_never_reach_a_parser(fmt, monkeypatch):
    """libsndfile tried every parser it has on an upload; only the four documented containers get to it."""
    import soundfile

    def parsed(*args, **kwargs):
        raise AssertionError("libsndfile parsed an upload of an undocumented format")

    data = encode(speech_like(2.0, 16000), 16000, fmt)
    monkeypatch.setattr(soundfile, "info", parsed)
    monkeypatch.setattr(soundfile, "read", parsed)
    err = _refused(data, None)
    assert err.code in ("unsupported_audio_format", "invalid_audio")
