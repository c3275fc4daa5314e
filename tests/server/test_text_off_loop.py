"""Request text is normalized in worker processes: long inputs hold up neither the event loop (probes,
other requests' audio) nor other requests' short texts, the segments are the in-process frontend's, and
a client that hangs up while its text is normalized leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool

import httpx
import numpy as np
import pytest
import websockets

from cosyvoice_server.api.schemas import MAX_INPUT_CHARS
from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.frontend import TextFrontend
from cosyvoice_server.model.manifest import load_manifest
from cosyvoice_server.text_workers import TextWorkers

# About a second of wetext on one core: numbers, dates and times in every sentence.
LONG = ("In 2024, 3 cats ate 12.5 kg of food on 3/4/2024 at 10:30am. " * 80)[:MAX_INPUT_CHARS]
TEXTS = [
    "I have 3 cats and 12 dogs",
    "今天是2024年1月3日，气温是25度。",
    "He said \"stop.\" Then 2 more ran away! Why? Because 3.5 kg.",
    "word " * 600,  # no punctuation: cut at the hard maximum
    "?!",  # punctuation only: nothing to say
    "\x01\x02 \t ",  # control characters and blanks only
    LONG,
]


@pytest.fixture(scope="module")
def frontend_spec():
    return load_manifest(BUNDLED_MODEL).frontend


def test_worker_segments_are_the_in_process_frontends(frontend_spec):
    local = TextFrontend.of_model(BUNDLED_MODEL, frontend_spec)
    workers = TextWorkers(BUNDLED_MODEL, frontend_spec, 1)
    try:
        async def all_texts():
            return await asyncio.gather(*[workers.segments(t) for t in TEXTS])

        for text, got in zip(TEXTS, asyncio.run(all_texts())):
            want = local.segments(text)
            assert [s.tolist() for s in got] == [s.tolist() for s in want], text[:40]
            assert all(s.dtype == np.int64 for s in got)
    finally:
        workers.close()


def test_a_worker_starts_without_the_imports_that_made_it_slow() -> None:
    # What a text worker's start-up costs is its imports (docs/benchmarks.md, Start-up): onnx is not one of them,
    # inflect comes without typeguard's recompiled checks, and typeguard is left as it was for anything else.
    probe = """
import sys, typeguard
from cosyvoice_server import text_workers
from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.model.manifest import load_manifest
before = typeguard.typechecked
text_workers._init(str(BUNDLED_MODEL), load_manifest(BUNDLED_MODEL).frontend)
assert text_workers._error is None, text_workers._error
import inflect
print("onnx" in sys.modules, "typeguard" in inflect.engine.number_to_words.__code__.co_names,
      typeguard.typechecked is before, inflect.engine().number_to_words("42"))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["False", "False", "True", "forty-two"]


def test_a_worker_that_dies_is_replaced(frontend_spec):
    workers = TextWorkers(BUNDLED_MODEL, frontend_spec, 1)
    try:
        async def kill_then_retry():
            os.kill(next(iter(workers.pool._processes)), signal.SIGKILL)
            with pytest.raises(BrokenProcessPool):
                await workers.segments("Killed while waiting.")
            return await workers.segments("I have 3 cats.")

        assert [s.tolist() for s in asyncio.run(kill_then_retry())]
    finally:
        workers.close()


def _metric(text: str, name: str, code: str) -> float:
    m = re.search(rf'^{name}{{code="{code}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def short_audio_server(server_process, tmp_path_factory):
    """A long input is refused (400 input_too_long) right after its text is normalized: no synthesis
    follows, so what the long request costs is its normalization alone."""
    s = server_process(tmp_path_factory.mktemp("textloop"), "--max-audio-seconds", "1").wait_ready()
    yield s
    s.stop()


async def _during_long_inputs(url: str, probe, n: int = 2) -> tuple[float, list[float]]:
    """(seconds `n` long inputs sent at once took, each probe's latency while they were being normalized)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def long_input():
            r = await client.post("/v1/audio/speech", json={"model": "tts-1", "input": LONG})
            assert r.status_code == 400 and r.json()["error"]["code"] == "input_too_long", r.text

        t0 = time.perf_counter()
        task = asyncio.gather(*[long_input() for _ in range(n)])
        await asyncio.sleep(0.05)  # the long requests are read and their texts handed over
        latencies = []
        while not task.done():
            t = time.perf_counter()
            await probe(client)
            latencies.append(time.perf_counter() - t)
            await asyncio.sleep(0.01)
        await task
        return time.perf_counter() - t0, latencies


def test_long_inputs_stall_neither_probes_nor_other_requests(short_audio_server):
    async def healthz(client):
        assert (await client.get("/healthz")).status_code == 200

    async def unspeakable(client):  # a short text: it never waits behind the long ones for a worker
        r = await client.post("/v1/audio/speech", json={"model": "tts-1", "input": "?!"})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {"message": "The input has no speakable text after normalization.",
                                     "type": "invalid_request_error", "param": "input", "code": "invalid_value"}

    for probe in (healthz, unspeakable):
        took, latencies = asyncio.run(_during_long_inputs(short_audio_server.url, probe))
        assert took > 0.4, "the long inputs are normalized too fast to tell a stalled loop from a free one"
        # On the event loop, or with every worker on a long text, a probe waits for a whole normalization.
        assert max(latencies) < 0.25 * took, (probe.__name__, took, latencies)
        assert len(latencies) >= 3


def test_a_speech_sessions_large_messages_do_not_stall_the_server(short_audio_server):
    """A WebSocket session sends the largest messages it may, back to back (punctuation runs: tokenized,
    nothing to say). Their text is tokenized off the event loop, in slices: probes answer at once. On the
    loop, each probe waited for the rest of the message being tokenized, half a message's time on average."""
    messages, delta = 16, "，" * 20_000  # 60 KB of JSON each, under --max-body-bytes

    async def run():
        latencies = []
        async with websockets.connect(short_audio_server.url.replace("http", "ws") + "/v1/audio/speech/stream",
                                      max_size=None) as ws, httpx.AsyncClient(base_url=short_audio_server.url) as c:
            await ws.send(json.dumps({"type": "session.update", "session": {"response_format": "pcm"}}))
            assert json.loads(await ws.recv())["type"] == "session.created"
            t0 = time.perf_counter()
            for _ in range(messages):
                await ws.send(json.dumps({"type": "input_text.append", "text": delta}, ensure_ascii=False))
            await ws.send(json.dumps({"type": "input_text.end"}))
            done = asyncio.ensure_future(ws.recv())
            while not done.done():
                t = time.perf_counter()
                assert (await c.get("/healthz")).status_code == 200
                latencies.append(time.perf_counter() - t)
                await asyncio.sleep(0.005)
            assert json.loads(done.result())["type"] == "speech.audio.done"
            return time.perf_counter() - t0, latencies

    took, latencies = asyncio.run(run())
    per_message = took / messages
    assert len(latencies) >= 10, (took, latencies)
    assert float(np.median(latencies)) < 0.2 * per_message, (per_message, sorted(latencies))


def test_a_client_that_hangs_up_while_its_text_is_normalized_leaves_no_request(server_process, tmp_path):
    # One slot (batch 1, no queue); room for the long input's audio, so it is accepted once normalized.
    s = server_process(tmp_path, "--max-queue-size", "0", "--max-batch-size", "1",
                       "--max-audio-seconds", "3600").wait_ready()
    try:
        before = _metric(s.metrics(), "cosyvoice_requests_total", "499")
        body = httpx.Request("POST", s.url + "/v1/audio/speech",
                             json={"model": "tts-1", "input": LONG.replace("1", "2")}).content
        with socket.create_connection(("127.0.0.1", s.port)) as sock:
            sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(0.1)  # its text is in a worker now
        deadline = time.monotonic() + 30
        while _metric(s.metrics(), "cosyvoice_requests_total", "499") == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _metric(s.metrics(), "cosyvoice_requests_total", "499") == before + 1
        assert httpx.get(s.url + "/readyz").json()["inflight"] == 0
        # The only slot is free: a request is served, not refused with 429.
        r = httpx.post(s.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Still here."}, timeout=60)
        assert r.status_code == 200 and r.content
    finally:
        s.stop()


def test_a_full_server_refuses_long_inputs_at_once_without_normalizing_them(server_process, tmp_path):
    """The only slot is held by an open speech session. Six long inputs (about a second of normalizing each,
    one text worker) are refused with 429 at once: normalized first, the last refusal came six seconds
    late, and the text of every request accepted meanwhile would have waited behind them."""
    s = server_process(tmp_path, "--max-queue-size", "0", "--max-batch-size", "1", "--text-workers", "1",
                       "--max-audio-seconds", "3600").wait_ready()

    async def flood():
        async with websockets.connect(s.url.replace("http", "ws") + "/v1/audio/speech/stream") as ws:
            await ws.send(json.dumps({"type": "session.update", "session": {"response_format": "pcm"}}))
            assert json.loads(await ws.recv())["type"] == "session.created"
            async with httpx.AsyncClient(timeout=60) as c:
                started = time.monotonic()
                answers = await asyncio.gather(*[c.post(s.url + "/v1/audio/speech", json={
                    "model": "tts-1", "input": LONG.replace("1", str(i + 2))}) for i in range(6)])
                took = time.monotonic() - started
        return answers, took

    try:
        answers, took = asyncio.run(flood())
        assert [r.status_code for r in answers] == [429] * 6
        assert all(r.json()["error"]["code"] == "server_overloaded" and r.headers["Retry-After"] for r in answers)
        assert took < 1.0, took
        # the session closed: its slot is free again
        r = httpx.post(s.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Still here."}, timeout=60)
        assert r.status_code == 200 and r.content
    finally:
        s.stop()
