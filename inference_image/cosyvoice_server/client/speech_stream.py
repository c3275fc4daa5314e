"""An async client for GET /v1/audio/speech/stream (docs/streaming.md): text in as it is written,
audio out as it is spoken.

    async with await connect("http://127.0.0.1:8000", voice="default", response_format="pcm") as s:
        await s.append("Hello, ")
        await s.append("world.")
        await s.end()
        async for event in s:
            if isinstance(event, AudioChunk):
                player.write(event.data)

`speak()` does both halves at once for a text generator (an LLM's token stream) and returns the
audio with the arrival time of each chunk.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

PATH = "/v1/audio/speech/stream"
SUBPROTOCOL = "cosyvoice.speech.v1"


@dataclass(frozen=True)
class AudioChunk:
    data: bytes  # in the session's response_format
    segment: int | None  # only known with stream_format "json"
    received_at: float  # time.monotonic()


@dataclass(frozen=True)
class SegmentDone:
    """A segment's audio is all out: what it said and where it is in the session's audio. A <break> of an SSML
    session is a segment too: `segment` None, `is_break` True, `text` empty."""

    segment: int | None
    usage: dict[str, Any]
    received_at: float
    text: str = ""
    start_s: float = 0.0
    end_s: float = 0.0
    is_break: bool = False


@dataclass(frozen=True)
class AudioDone:
    usage: dict[str, Any]
    received_at: float


Event = AudioChunk | SegmentDone | AudioDone


class StreamError(Exception):
    """The server's `error` event (OpenAI's error object) and the close code that followed it."""

    def __init__(self, error: dict[str, Any], close_code: int | None = None) -> None:
        super().__init__(error.get("message", "error"))
        self.message: str = error.get("message", "")
        self.code: str | None = error.get("code")
        self.type: str | None = error.get("type")
        self.param: str | None = error.get("param")
        self.event_id: str | None = error.get("event_id")
        self.close_code = close_code


def stream_url(base_url: str) -> str:
    """http(s)://host[:port] (or ws(s)://...) -> the stream endpoint's ws(s):// URL."""
    url = base_url.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if url.startswith(http):
            url = ws + url[len(http):]
    return url if url.endswith(PATH) else url + PATH


class SpeechStream:
    """One session; use `connect()` to open it."""

    def __init__(self, conn: ClientConnection, session: dict[str, Any], limits: dict[str, Any]) -> None:
        self.conn = conn
        self.session = session  # as the server resolved it (session.created)
        self.limits = limits
        self.first_text_at: float | None = None
        self.close_code: int | None = None

    async def append(self, text: str) -> None:
        if text and self.first_text_at is None:
            self.first_text_at = time.monotonic()
        await self._send({"type": "input_text.append", "text": text})

    async def flush(self) -> None:
        await self._send({"type": "input_text.flush"})

    async def end(self) -> None:
        await self._send({"type": "input_text.end"})

    async def _send(self, event: dict[str, Any]) -> None:
        try:
            await self.conn.send(json.dumps(event))
        except ConnectionClosed:
            pass  # the server ended the session: its error event is read by the receiving side

    async def __aiter__(self) -> AsyncIterator[Event]:
        """Audio and events until speech.audio.done; StreamError on an error event or an unexpected close."""
        error: dict[str, Any] | None = None
        try:
            async for message in self.conn:
                now = time.monotonic()
                if isinstance(message, bytes):
                    yield AudioChunk(message, None, now)
                    continue
                event = json.loads(message)
                kind = event.get("type")
                if kind == "speech.audio.delta":
                    yield AudioChunk(base64.b64decode(event["audio"]), event.get("segment"), now)
                elif kind == "speech.segment.done":
                    yield SegmentDone(event["segment"], event.get("usage", {}), now, event.get("text", ""),
                                      event.get("start_s", 0.0), event.get("end_s", 0.0), event.get("break", False))
                elif kind == "speech.audio.done":
                    yield AudioDone(event.get("usage", {}), now)
                    return
                elif kind == "error":
                    error = event.get("error", {})
        except ConnectionClosed:
            pass
        self.close_code = self.conn.close_code
        raise StreamError(error or {"message": f"the connection closed (code {self.close_code}) before "
                                               "speech.audio.done", "code": "connection_closed"}, self.close_code)

    async def close(self) -> None:
        await self.conn.close()
        self.close_code = self.conn.close_code

    async def __aenter__(self) -> SpeechStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(base_url: str, *, api_key: str | None = None, open_timeout: float = 10.0,
                  **session: Any) -> SpeechStream:
    """Opens a session with `session` options (model, voice, response_format, sample_rate, stream_format,
    seed, speed, instructions, input_format ("ssml": the text is one SSML document sent in pieces), lexicons (a
    list of names; [] turns the server's defaults off); None values are left out) and waits for session.created.
    Raises StreamError when the server refuses the session, or websockets' InvalidStatus (e.g. 401)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    conn = await ws_connect(stream_url(base_url), additional_headers=headers, subprotocols=[SUBPROTOCOL],
                            open_timeout=open_timeout, max_size=16 * 2**20)
    try:
        await conn.send(json.dumps({"type": "session.update",
                                    "session": {k: v for k, v in session.items() if v is not None}}))
        event = json.loads(await asyncio.wait_for(conn.recv(), open_timeout))
    except ConnectionClosed:
        raise StreamError({"message": f"the connection closed (code {conn.close_code}) before session.created",
                           "code": "connection_closed"}, conn.close_code) from None
    except BaseException:
        await conn.close()
        raise
    if event.get("type") == "error":
        try:
            await asyncio.wait_for(conn.wait_closed(), open_timeout)
        except TimeoutError:
            await conn.close()
        raise StreamError(event.get("error", {}), conn.close_code)
    return SpeechStream(conn, event.get("session", {}), event.get("limits", {}))


@dataclass
class StreamResult:
    """What `speak` heard: the audio in arrival order and when each piece came."""

    session: dict[str, Any]
    chunks: list[AudioChunk] = field(default_factory=list)
    segments: list[SegmentDone] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    first_text_at: float | None = None
    last_text_at: float | None = None

    @property
    def audio(self) -> bytes:
        return b"".join(c.data for c in self.chunks)

    @property
    def text_to_first_audio_s(self) -> float | None:
        if not self.chunks or self.first_text_at is None:
            return None
        return self.chunks[0].received_at - self.first_text_at


async def speak(stream: SpeechStream, deltas: AsyncIterable[str] | Iterable[str], *,
                flush_on: tuple[str, ...] = ()) -> StreamResult:
    """Feeds `deltas` (an LLM's token stream) while collecting the audio, then ends the input.
    `flush_on`: flush after a delta that ends with one of these (e.g. (".", "?", "!") to make each
    sentence its own segment, as a voice agent does at the end of a thought)."""
    result = StreamResult(stream.session)

    async def feed() -> None:
        if isinstance(deltas, AsyncIterable):
            async for d in deltas:
                await _one(d)
        else:
            for d in deltas:
                await _one(d)
        await stream.end()

    async def _one(d: str) -> None:
        await stream.append(d)
        result.last_text_at = time.monotonic()
        if flush_on and d.rstrip().endswith(flush_on):
            await stream.flush()

    feeder = asyncio.create_task(feed())
    try:
        async for event in stream:
            if isinstance(event, AudioChunk):
                result.chunks.append(event)
            elif isinstance(event, SegmentDone):
                result.segments.append(event)
            else:
                result.usage = event.usage
    finally:
        if not feeder.done():
            feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
    result.first_text_at = stream.first_text_at
    return result
