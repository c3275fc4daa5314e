"""GET /v1/audio/speech/stream against a real server process: text fed as an LLM writes it, audio
back while it is written, in every streamable format, with per-segment usage."""

from __future__ import annotations

import asyncio
import io
import json
import struct

import av
import httpx
import numpy as np
import pytest
from wskit import SENTENCE, assert_server_healthy, metric, open_raw, send, start, until_closed

from cosyvoice_server.client import AudioChunk, StreamError, connect, speak


async def words(text: str, rate_per_s: float):
    """An LLM-like token stream: word pieces at `rate_per_s`."""
    for i, w in enumerate(text.split(" ")):
        yield ("" if i == 0 else " ") + w
        await asyncio.sleep(1 / rate_per_s)


async def test_a_sentence_fed_word_by_word_starts_playing_before_its_end(server) -> None:
    long = " ".join([SENTENCE] * 3)
    async with await connect(server.url, seed=3) as s:
        result = await speak(s, words(long, rate_per_s=25))
    assert result.chunks, "no audio"
    assert result.chunks[0].received_at < result.last_text_at, "the first audio came only after the whole text"
    pcm = np.frombuffer(result.audio, "<i2")
    assert len(pcm) / 24000 == pytest.approx(result.usage["audio_seconds"], abs=0.01)
    assert result.usage["input_characters"] == len(long)
    assert metric(server.url, "cosyvoice_stream_text_to_first_audio_seconds_count") >= 1


async def test_flushes_make_segments_each_with_its_usage_then_done_and_a_normal_close(server) -> None:
    first, second = "One thought ends here.", " And the next begins."
    ws = await open_raw(server.url)
    created = await start(ws, voice={"id": "warm"}, seed=1)
    assert created["session"]["voice"] == "warm" and created["session"]["sample_rate"] == 24000
    assert created["limits"]["idle_timeout_s"] > 0
    await send(ws, {"type": "input_text.append", "text": first})
    await send(ws, {"type": "input_text.flush"})
    await send(ws, {"type": "input_text.flush"})  # nothing new: no segment
    await send(ws, {"type": "input_text.append", "text": second})
    await send(ws, {"type": "input_text.end"})
    events, frames, code = await until_closed(ws)
    assert code == 1000
    kinds = [e["type"] for e in events]
    assert kinds == ["speech.segment.done", "speech.segment.done", "speech.audio.done"]
    seg = [e["usage"] for e in events[:2]]
    assert [e["segment"] for e in events[:2]] == [0, 1]
    assert [u["input_characters"] for u in seg] == [len(first), len(second.strip())]  # the text as spoken
    assert [e["auto"] for e in events[:2]] == [False, False]  # both ended by the client
    total = events[-1]["usage"]
    assert total["input_characters"] == len(first + second)
    assert total["audio_seconds"] == pytest.approx(sum(u["audio_seconds"] for u in seg), abs=0.01)
    assert len(b"".join(frames)) == pytest.approx(total["audio_seconds"] * 24000 * 2, abs=2 * 24)
    assert_server_healthy(server.url)


def _decode(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(audio=0)]
        return np.concatenate(frames), c.streams.audio[0].codec_context.sample_rate


@pytest.mark.parametrize(("fmt", "rate"), [("pcm", 16000), ("wav", 8000), ("opus", 48000), ("mp3", 24000),
                                           ("wav", 44100)])
async def test_each_format_and_rate_streams_playable_audio_of_the_reported_length(server, fmt, rate) -> None:
    async with await connect(server.url, response_format=fmt, sample_rate=rate, seed=5) as s:
        assert s.session["sample_rate"] == rate
        result = await speak(s, [SENTENCE])
    seconds = result.usage["audio_seconds"]
    assert seconds > 0.5
    data = result.audio
    if fmt == "pcm":
        assert len(data) / 2 / rate == pytest.approx(seconds, abs=0.02)
        return
    if fmt == "wav":
        assert data[:4] == b"RIFF" and struct.unpack("<I", data[24:28])[0] == rate
        assert (len(data) - 44) / 2 / rate == pytest.approx(seconds, abs=0.02)
        return
    audio, got_rate = _decode(data)
    assert got_rate == rate
    assert len(audio) / rate == pytest.approx(seconds, abs=0.1)  # codec padding and priming


async def test_json_delivery_carries_the_same_audio_as_binary_frames(server) -> None:
    results = []
    for stream_format in ("audio", "json"):
        async with await connect(server.url, stream_format=stream_format, seed=11) as s:
            results.append(await speak(s, ["Same seed, ", "same text, ", "same audio."]))
    binary, js = results
    assert binary.audio and binary.audio == js.audio
    assert all(c.segment == 0 for c in js.chunks) and all(c.segment is None for c in binary.chunks)


async def test_unknown_voice_and_model_are_refused_before_any_audio(server) -> None:
    with pytest.raises(StreamError) as err:
        await connect(server.url, voice="nobody")
    assert (err.value.code, err.value.param, err.value.close_code) == ("invalid_voice", "session.voice", 1008)
    assert "default" in err.value.message  # lists what there is
    with pytest.raises(StreamError) as err:
        await connect(server.url, model="whisper-1")
    assert err.value.code == "model_not_found"
    with pytest.raises(StreamError) as err:
        await connect(server.url, response_format="opus", sample_rate=44100)
    assert err.value.code == "invalid_value" and "48000" in err.value.message


@pytest.mark.parametrize(("options", "status"), [({"voice": "nobody"}, 400), ({"voice": {"id": "nobody"}}, 400),
                                                 ({"model": "whisper-1"}, 404)])
async def test_http_and_the_stream_refuse_the_same_options_in_the_same_words(server, options, status) -> None:
    r = httpx.post(server.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Hello.", **options})
    assert r.status_code == status
    said = r.json()["error"]
    with pytest.raises(StreamError) as err:
        await connect(server.url, **options)
    assert (err.value.code, err.value.message, err.value.param) == (said["code"], said["message"],
                                                                    "session." + said["param"])


async def test_a_client_that_hangs_up_mid_stream_frees_its_session_at_once(server) -> None:
    ws = await open_raw(server.url)
    await start(ws)
    await send(ws, {"type": "input_text.append", "text": " ".join([SENTENCE] * 8)})
    await send(ws, {"type": "input_text.flush"})
    await ws.recv()  # audio is flowing
    await ws.close()
    assert_server_healthy(server.url)
    assert metric(server.url, "cosyvoice_stream_sessions_total", 'reason="client_closed"') >= 1


async def test_http_speech_still_works_beside_sessions(server) -> None:
    async with await connect(server.url) as s:
        await s.append("A session is open.")
        r = httpx.post(server.url + "/v1/audio/speech", json={"model": "tts-1", "input": "And HTTP answers.",
                                                               "response_format": "wav", "stream": False}, timeout=60)
        assert r.status_code == 200
        await s.end()
        chunks = [e async for e in _audio_until_done(s)]
    assert chunks


async def _audio_until_done(s):
    try:
        async for e in s:
            if isinstance(e, AudioChunk):
                yield e
    except StreamError as exc:  # pragma: no cover - a failure shows its error event
        raise AssertionError(json.dumps(exc.__dict__, default=str)) from exc


def test_the_voice_agent_example_runs_and_writes_a_playable_wav(server, tmp_path) -> None:
    import subprocess
    import sys
    import wave
    from pathlib import Path

    out = tmp_path / "reply.wav"
    example = Path(__file__).resolve().parents[2] / "examples" / "voice_agent_stream.py"
    r = subprocess.run([sys.executable, str(example), "--url", server.url, "--out", str(out), "--no-play",
                        "--tokens-per-s", "40", "--seed", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    first = next(i for i, x in enumerate(lines) if "first audio" in x)
    finished = next(i for i, x in enumerate(lines) if "LLM finished" in x)
    assert first < finished, r.stdout  # it spoke before the reply was complete
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 24000
