"""Helpers for the WebSocket speech-stream tests: raw connections (to send what the client module
never would), reading until the error event, and metric values."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from cosyvoice_server.client.speech_stream import SUBPROTOCOL, stream_url

SENTENCE = "Streaming text in, audio out: the voice starts before the sentence is complete."


async def open_raw(url: str, *, sock: socket.socket | None = None, **kw) -> ClientConnection:
    kw.setdefault("subprotocols", [SUBPROTOCOL])
    return await connect(stream_url(url), open_timeout=10, sock=sock, **kw)


async def send(ws: ClientConnection, event: dict | str | bytes) -> None:
    await ws.send(json.dumps(event) if isinstance(event, dict) else event)


async def start(ws: ClientConnection, **session) -> dict:
    await send(ws, {"type": "session.update", "session": session})
    created = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert created["type"] == "session.created", created
    return created


async def until_closed(ws: ClientConnection, timeout: float = 20) -> tuple[list[dict], list[bytes], int | None]:
    """Everything the server sends until it closes: (events, binary frames, close code)."""
    events, frames = [], []
    deadline = time.monotonic() + timeout
    try:
        while True:
            msg = await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
            if isinstance(msg, bytes):
                frames.append(msg)
            else:
                events.append(json.loads(msg))
    except ConnectionClosed:
        pass
    return events, frames, ws.close_code


def metric(url: str, name: str, labels: str = "") -> float:
    """One sample's value from /metrics (0 when absent)."""
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def wait_for_metric(url: str, name: str, labels: str, value: float, timeout: float = 15) -> float:
    deadline = time.monotonic() + timeout
    while (got := metric(url, name, labels)) != value and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def assert_server_healthy(url: str) -> None:
    """The server is still ready and holds nothing for ended sessions."""
    assert httpx.get(url + "/readyz", timeout=5).status_code == 200
    assert wait_for_metric(url, "cosyvoice_stream_sessions_open", "", 0) == 0
    assert wait_for_metric(url, "cosyvoice_inflight_requests", "", 0) == 0
    assert metric(url, "cosyvoice_stream_send_buffer_bytes") == 0
