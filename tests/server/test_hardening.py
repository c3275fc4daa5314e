"""Fail-closed auth, hostile inputs, slow clients, drain deadlines, redirects and the API documents,
against real server processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

LONG = " ".join(["Streaming speech synthesis keeps going for quite a while here."] * 30)


def body(text: str = "Hardened servers answer clearly.", **kw) -> dict:
    """A whole-file request (its status and headers say how it ended) unless kw says otherwise."""
    return {"model": "tts-1", "input": text, "response_format": "wav", "stream": False} | kw


def serve(env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess:
    """Runs `serve` expecting it to stop at start-up; a server that starts instead times out here."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("COSYVOICE_")} | env
    cmd = [sys.executable, "-m", "cosyvoice_server.cli", "serve", "--host", "127.0.0.1", "--port", str(free_port()),
           "--device", "cpu"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)


@pytest.mark.parametrize("case", ["dev-null", "empty", "whitespace", "missing", "directory", "unreadable", "blank-env"])
def test_auth_fails_closed_when_the_key_is_blank_or_unreadable(tmp_path, case):
    key = tmp_path / "key"
    env = {"COSYVOICE_API_KEY_FILE": str(key)}
    if case == "dev-null":
        env["COSYVOICE_API_KEY_FILE"] = "/dev/null"
    elif case == "empty":
        key.write_text("")
    elif case == "whitespace":
        key.write_text("  \n\t\n")
    elif case == "directory":
        key.mkdir()
    elif case == "unreadable":
        key.write_bytes(b"\xff\xfe not utf-8")
    elif case == "blank-env":
        env = {"COSYVOICE_API_KEY": "   "}
    r = serve(env)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr
    assert "refusing to start" in lines[0]
    if case != "blank-env":
        assert env["COSYVOICE_API_KEY_FILE"] in lines[0]


def test_key_comparison_is_constant_time(monkeypatch):
    import hmac

    from fastapi.testclient import TestClient

    from cosyvoice_server.app import create_app
    from cosyvoice_server.config import Settings

    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    client = TestClient(create_app(Settings(device="cpu", api_key="s3cret")))  # no lifespan: no model load
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3creX"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert calls == [(b"s3creX", b"s3cret"), (b"s3cret", b"s3cret")]


def test_documents_follow_the_api_key_or_are_off(start_server):
    s = start_server(env={"COSYVOICE_API_KEY": "k3y"})
    auth = {"Authorization": "Bearer k3y"}
    for path in ("/docs", "/redoc", "/openapi.json"):
        r = httpx.get(s.url + path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        assert httpx.get(s.url + path, headers=auth).status_code == 200, path
    assert "/v1/audio/speech" in httpx.get(s.url + "/openapi.json", headers=auth).json()["paths"]
    off = start_server("--docs", "false")
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(off.url + path).status_code == 404, path


def test_trailing_slash_does_not_redirect_to_the_clients_host(server):
    r = httpx.get(server.url + "/v1/models/", headers={"Host": "attacker.example"}, follow_redirects=False)
    assert "attacker.example" not in r.headers.get("location", "")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"  # a model id of ''


@pytest.mark.parametrize("payload", [
    b"[" * 20000 + b"]" * 20000,
    b'{"model": "tts-1", "input": "hi", "extra": ' + b"[" * 20000 + b"]" * 20000 + b"}",
])
def test_deeply_nested_json_is_a_400(server, payload):
    r = httpx.post(server.url + "/v1/audio/speech", content=payload, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json"


def test_input_limit_applies_after_nfkc_normalization(server):
    t0 = time.monotonic()
    r = httpx.post(server.url + "/v1/audio/speech", json=body("\ufdfa" * 4096), timeout=60)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "input" and "73728 characters after Unicode (NFKC)" in err["message"]
    assert time.monotonic() - t0 < 5
    # the same number of characters that stay single characters is accepted
    assert httpx.post(server.url + "/v1/audio/speech", json=body("a" * 10), timeout=60).status_code == 200


def test_output_is_bounded_by_max_audio_seconds(start_server):
    s = start_server("--max-audio-seconds", "3")
    r = httpx.post(s.url + "/v1/audio/speech", json=body(LONG), timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "input_too_long" and err["param"] == "input" and "limit is 3 s" in err["message"]
    # an input whose shortest reading fits is synthesized, but never past the bound (slower speech: fewer tokens)
    for speed in (1.0, 0.5):
        ok = httpx.post(s.url + "/v1/audio/speech", json=body("Short one.", speed=speed, seed=1),
                        timeout=60)
        assert ok.status_code == 200, ok.text
        assert float(ok.headers["x-audio-duration-seconds"]) <= 3.0 + 0.04
        assert int(ok.headers["x-speech-tokens"]) <= 3 * 25 * speed


def _slow_client(port: int) -> socket.socket:
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")
    return c


def test_slowloris_connections_are_closed_and_do_not_hold_the_server(start_server):
    s = start_server("--header-timeout-s", "1")
    slow = [_slow_client(s.port) for _ in range(200)]
    t0 = time.monotonic()
    for c in slow:  # keep trickling header bytes: activity alone must not extend the deadline
        c.sendall(b"X-A: b\r\n")
    ok = httpx.post(s.url + "/v1/audio/speech", json=body(), timeout=30)
    assert ok.status_code == 200
    closed = 0
    for c in slow:
        c.settimeout(max(0.1, 3 - (time.monotonic() - t0)))
        try:
            closed += c.recv(1024) == b""
        except (TimeoutError, ConnectionResetError):
            closed += isinstance(sys.exc_info()[1], ConnectionResetError)
        c.close()
    assert closed == 200
    assert time.monotonic() - t0 < 5


def test_a_stalled_body_gets_408_in_openai_shape(start_server):
    s = start_server("--body-timeout-s", "1")
    with socket.create_connection(("127.0.0.1", s.port)) as c:
        c.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"model\":")
        c.settimeout(5)
        t0 = time.monotonic()
        data = b""
        while chunk := c.recv(4096):
            data += chunk
    assert time.monotonic() - t0 < 3
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert b'"code":"request_timeout"' in payload


def test_a_client_that_hangs_up_mid_body_ends_quietly(server):
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as c:
            c.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"model\":")
            time.sleep(0.2)  # the handler is waiting for the rest of the body
    deadline = time.monotonic() + 5
    while 'cosyvoice_requests_total{code="499"' not in server.metrics():
        assert time.monotonic() < deadline, "hang-ups mid-body are not counted as 499"
        time.sleep(0.1)
    assert "Traceback" not in server.log()
    assert httpx.post(server.url + "/v1/audio/speech", json=body(), timeout=30).status_code == 200


async def test_drain_timeout_answers_503_in_openai_shape(start_server):
    s = start_server("--drain-timeout-s", "0.3")
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        tasks = [asyncio.create_task(client.post("/v1/audio/speech", json=body(LONG, seed=i))) for i in range(2)]
        sse = body(LONG, seed=9, stream=True, stream_format="sse", response_format="pcm")
        events: list[dict] = []

        async def read_sse():
            async with client.stream("POST", "/v1/audio/speech", json=sse) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))

        tasks.append(asyncio.create_task(read_sse()))
        while not events or 'cosyvoice_inflight_requests 3.0' not in (await client.get("/metrics")).text:
            await asyncio.sleep(0.02)
        # one more whose text (numbers and dates all through: most of a second of normalizing) is still being
        # normalized when the drain deadline passes: it is answered too, when it reaches the scheduler
        numbers = ("In 2024, 3 cats ate 12.5 kg of food on 3/4/2024 at 10:30am. " * 50)[:3000]
        tasks.append(asyncio.create_task(client.post("/v1/audio/speech", json=body(numbers))))
        while 'cosyvoice_inflight_requests 4.0' not in (await client.get("/metrics")).text:
            await asyncio.sleep(0.01)
        s.proc.send_signal(signal.SIGTERM)
        done = await asyncio.gather(*tasks)
    for r in done[:2] + done[3:]:
        assert r.status_code == 503, r.text[:200]
        assert r.json()["error"]["code"] == "shutting_down" and r.headers["retry-after"] == "1"
    assert events and events[-1]["type"] == "error" and events[-1]["error"]["code"] == "shutting_down", events[-1:]
    assert s.proc.wait(30) == 0
