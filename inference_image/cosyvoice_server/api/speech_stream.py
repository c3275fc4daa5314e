"""GET /v1/audio/speech/stream: text in as it is written, audio out as it is spoken (WebSocket).

One session is one bistream synthesis request in the shared scheduler. Three tasks serve it: the
receiver reads client events and feeds the text, the pump turns the request's output into encoded
frames in an outbox, and the sender writes the outbox to the socket. A client that does not read
shows twice: what the server holds for it (the outbox, and what its connection's transport and the
kernel have not delivered) passes `stream_send_buffer_bytes`, or a write waits longer than
`stream_send_timeout_s` for it to take what is pending. Either ends the session with slow_consumer;
when even the close cannot be written the connection is aborted. So a stalled reader neither grows
the server's memory nor keeps its session. The protocol is stream_protocol.py (docs/streaming.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable

import numpy as np
from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from .. import synthesis
from ..audio import FORMATS, StreamEncoder, StreamResampler
from ..frontend import speakable
from ..origins import is_own_origin, origin_allowed
from ..pronunciation import ssml
from ..pronunciation.phones import PronunciationError
from ..pronunciation.plan import Run, StreamLexicon
from ..pronunciation.xml import XmlError
from ..refusals import (BAD_KEY, INTERNAL, INVALID_SSML, PRONUNCIATION_UNSUPPORTED, PROSODY_WITH_STREAMED_TEXT, Refusal,
                        sentence)
from ..scheduling.request import Done, Outcome, SegmentDone, SynthesisRequest
from ..scheduling.scheduler import Overloaded
from ..state import ServerState
from ..timeouts import SEND_FLOW, SendFlow
from . import stream_protocol as p
from .auth import matches, presented_tokens
from .errors import response
from .stream_gate import Connection, client_of, origin_refusal

log = logging.getLogger(__name__)

PATH = "/v1/audio/speech/stream"
SUBPROTOCOL = "cosyvoice.speech.v1"
KEY_SUBPROTOCOL_PREFIX = "cosyvoice.key."  # + the API key, base64url without padding (browsers cannot set headers)
FINAL_SEND_TIMEOUT_S = 2.0  # the error event and close frame to a client that may not be reading
IDLE_POLL_S = 0.5

router = APIRouter()


def _offered_subprotocols(ws: WebSocket) -> list[str]:
    # repeated header lines are one list (RFC 6455)
    return [x.strip() for line in ws.headers.getlist("sec-websocket-protocol") for x in line.split(",") if x.strip()]


def _presented_keys(ws: WebSocket) -> list[str]:
    """Every key the client presented: each Authorization header and each key subprotocol."""
    keys = presented_tokens(ws.headers.getlist("authorization"))
    for proto in _offered_subprotocols(ws):
        if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
            encoded = proto[len(KEY_SUBPROTOCOL_PREFIX):]
            try:
                keys.append(base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_",
                                             validate=True).decode())
            except (binascii.Error, UnicodeDecodeError, ValueError):
                keys.append("")
    return keys


def authorized(ws: WebSocket, keys: list[str]) -> bool:
    """Fail closed: with a key configured, every credential presented must be one (the API key or the
    registration key, as on HTTP), and one must be presented."""
    if not keys:
        return True
    presented = _presented_keys(ws)
    return bool(presented) and all([matches(k, keys) for k in presented])


async def _deny(ws: WebSocket, refusal: Refusal) -> None:
    """Refuses in the handshake, as the HTTP API refuses: the status and OpenAI's error shape."""
    await ws.send_denial_response(response(refusal))


def _check_handshake(ws: WebSocket, s: ServerState) -> Refusal | str:
    """The refusal of this handshake, or the client it comes from (for the per-client cap)."""
    origins = ws.headers.getlist("origin")
    own = s.settings.playground and is_own_origin(origins, ws.headers.get("host"))
    if not (own or origin_allowed(origins, s.settings.allowed_origins())):
        return origin_refusal(", ".join(origins))
    keys = [k.current() for k in (s.api_key, s.registration_key) if k is not None] if s.api_key is not None else []
    if not authorized(ws, keys):
        return BAD_KEY(how=f"'Authorization: Bearer <key>', or from a browser the subprotocol "
                       f"'{KEY_SUBPROTOCOL_PREFIX}<the key, base64url>'")
    return client_of(_presented_keys(ws) if keys else [], ws.client.host if ws.client else None)


@router.websocket(PATH)
async def speech_stream(ws: WebSocket) -> None:
    s: ServerState = ws.app.state.server
    checked = _check_handshake(ws, s)
    admitted = ws.app.state.stream_connections.admit(checked) if isinstance(checked, str) else checked
    if isinstance(admitted, Refusal):
        s.metrics.stream_sessions.labels(admitted.code).inc()
        if admitted.code != "invalid_api_key":
            s.metrics.admission_refusals.labels("websocket", admitted.code).inc()
        await _deny(ws, admitted)
        return
    try:
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in _offered_subprotocols(ws) else None)
        await _Session(ws, s, admitted).run()
    finally:
        admitted.close()


class _SlowConsumer(Exception):
    """The client is not taking its audio; the message says how that showed."""


class _Session:
    def __init__(self, ws: WebSocket, state: ServerState, connection: Connection | None = None) -> None:
        self.ws = ws
        self.connection = connection
        self.s = state
        self.m = state.metrics
        self.settings = state.settings
        self.id = f"sess_{uuid.uuid4().hex[:20]}"
        self.rules = p.SessionRules()
        self.req: SynthesisRequest | None = None
        self.options: p.SessionOptions | None = None
        # (frame, carries audio, for a segment's done event: when its text ended, for the lag metric)
        self.outbox: deque[tuple[str | bytes, bool, float | None]] = deque()
        self.buffered = 0  # bytes in the outbox
        # the connection's write side, where the server runs with timeouts.websocket_protocol
        self.flow: SendFlow | None = (ws.scope.get("extensions") or {}).get(SEND_FLOW)
        self.wake = asyncio.Event()
        self.last_activity = time.monotonic()
        self.first_text_at: float | None = None
        self.first_audio_sent = False
        self.done_segments = 0  # segments whose audio is all out
        self.total_chars = 0
        self.total_samples = 0
        self.usage_tokens = [0, 0]  # text, speech
        self.pump_done = asyncio.Event()
        self.lexicon: StreamLexicon | None = None
        self.ssml = None  # the incremental SSML parser of an input_format "ssml" session
        self.actions: list = []  # what the SSML parser read from the last append, to apply in order
        self.pauses: deque[tuple[int, float]] = deque()  # (silence after this many closed segments, seconds)
        self.segment_start = 0  # samples before the segment now playing

    # The whole session -----------------------------------------------------------------------------
    async def run(self) -> None:
        self.m.stream_sessions_open.inc()
        self.m.stream_send_holders.add(self._held)
        started = time.monotonic()
        expires = started + self.settings.stream_max_session_s
        reason, outcome = "client_closed", Outcome.CANCELLED
        tasks: list[asyncio.Task] = []
        try:
            try:
                try:
                    first = await self._first_event()
                finally:  # no longer waiting for session.update: a session or its refusal follows
                    if self.connection is not None:
                        self.connection.session_started()
                await self._start(first)
            except p.ProtocolError as exc:
                reason = exc.code
                await self._fail(exc)
                return
            except WebSocketDisconnect:
                return
            tasks = [asyncio.create_task(self._receive(), name=f"{self.id}-receive"),
                     asyncio.create_task(self._pump(), name=f"{self.id}-pump"),
                     asyncio.create_task(self._send(), name=f"{self.id}-send")]
            pending, ended = set(tasks), None
            while ended is None:
                done, pending = await asyncio.wait(pending, timeout=max(0.0, expires - time.monotonic()),
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break  # its lifetime is over, whatever it is doing
                # the pump ending without an error only means all output is queued: the sender decides
                ended = next((t for t in done if t is not tasks[1] or t.exception() is not None), None)
            reason, outcome, error = self._ending(ended) if ended is not None else self._expired()
            await self._stop(tasks)
            if error is not None:
                await self._fail(error)
            elif reason == "done" and not await self._close(p.NORMAL, "done", self.settings.stream_send_timeout_s):
                reason = "slow_consumer"  # it never took the end of its audio: the connection was aborted
        finally:
            for t in tasks:
                t.cancel()
            if self.req is not None:
                self.req.cancel()  # nothing if it has ended
            self.m.stream_sessions_open.dec()
            self.m.stream_send_holders.discard(self._held)
            self.outbox.clear()
            self.buffered = 0
            self.m.stream_sessions.labels(reason).inc()
            self.m.stream_session_duration.observe(time.monotonic() - started)
            if self.req is not None:
                self.m.stream_session_audio.observe(self.total_samples / self.s.pipeline.sample_rate)
            log.debug("%s ended: %s", self.id, reason)

    def _expired(self) -> tuple[str, Outcome, p.ProtocolError]:
        limit = self.settings.stream_max_session_s
        return "session_expired", Outcome.CANCELLED, p.ProtocolError(
            "session_expired", f"The session reached its maximum duration of {limit:g} s; open a new session to go "
            "on.")

    def _ending(self, task: asyncio.Task) -> tuple[str, Outcome, p.ProtocolError | None]:
        """Why the session ends, from the first task that ended it: (reason, outcome, error to send)."""
        exc = task.exception()
        if isinstance(exc, p.ProtocolError):
            return exc.code, Outcome.CANCELLED, exc
        if isinstance(exc, _SlowConsumer):
            return "slow_consumer", Outcome.CANCELLED, p.ProtocolError(
                "slow_consumer", f"The client did not read its audio: {exc}. Read the socket continuously (buffer "
                "audio on the client).")
        if isinstance(exc, _Ended):
            return exc.reason, exc.outcome, exc.error
        if isinstance(exc, WebSocketDisconnect):
            if self.pump_done.is_set() and not self.outbox:  # it hung up after speech.audio.done
                return "done", Outcome.OK, None
            return "client_closed", Outcome.CANCELLED, None
        if exc is not None:
            log.error("%s: %s", self.id, exc, exc_info=exc)
            return "internal_error", Outcome.FAILED, p.ProtocolError.of(INTERNAL(exception=exc.__class__.__name__))
        return "done", Outcome.OK, None  # the sender delivered everything after speech.audio.done

    # Start ---------------------------------------------------------------------------------------------
    async def _first_event(self) -> p.SessionUpdate:
        event = await self._next_event(timeout=self.settings.stream_idle_timeout_s)
        if event is None:
            raise p.ProtocolError("idle_timeout", f"No session.update within {self.settings.stream_idle_timeout_s:g} s "
                                  "of connecting; send it as soon as the socket is open.")
        self.rules.check(event)
        assert isinstance(event, p.SessionUpdate)
        return event

    async def _start(self, event: p.SessionUpdate) -> None:
        s, o, eid = self.s, event.options, event.event_id
        voice = await synthesis.resolve(s, o)
        matcher = synthesis.matcher(s, o.lexicons) if not isinstance(voice, Refusal) else None
        if isinstance(matcher, Refusal):
            raise p.ProtocolError.of(matcher, eid)
        req = voice if isinstance(voice, Refusal) else synthesis.streamed_text(s, voice, o.seed, o.instructions)
        if not isinstance(req, Refusal):
            try:
                s.scheduler.submit(req)
            except Overloaded as exc:
                req = synthesis.overloaded(exc)
        if isinstance(req, Refusal):
            raise p.ProtocolError.of(req, eid)
        rate = o.rate(s.pipeline.sample_rate)
        self.req, self.options = req, o
        phones = s.pipeline.frontend.phones
        self.lexicon = StreamLexicon(matcher, phones)
        if o.input_format == "ssml":
            self.ssml, _ = ssml.parser(self.actions.append, phones, speed_ok=False,
                                       speed_refusal=PROSODY_WITH_STREAMED_TEXT, max_chars=ssml.MAX_STREAMED_SSML_CHARS)
        self.rate = rate
        self.encoder = StreamEncoder(o.response_format, rate)
        self.resampler = StreamResampler(s.pipeline.sample_rate, rate) if rate != s.pipeline.sample_rate else None
        self.header = self.encoder.header()
        await self.ws.send_text(json.dumps({
            "type": "session.created", "event_id": eid,
            "session": {"id": self.id, "model": s.model_id, "voice": voice.name, "response_format": o.response_format,
                        "sample_rate": rate, "stream_format": o.stream_format, "seed": o.seed,
                        "instructions": o.instructions, "input_format": o.input_format,
                        "lexicons": o.lexicons if o.lexicons is not None else
                        [n for n in s.lexicons.defaults if n in s.lexicons.entries]},
            "limits": {"max_message_bytes": self.settings.max_body_bytes,
                       "idle_timeout_s": self.settings.stream_idle_timeout_s,
                       "send_buffer_bytes": self.settings.stream_send_buffer_bytes,
                       "send_timeout_s": self.settings.stream_send_timeout_s,
                       "max_session_s": self.settings.stream_max_session_s},
        }))
        self.last_activity = time.monotonic()  # the idle clock starts with the session

    # Receiving -----------------------------------------------------------------------------------------
    def _idle_error(self) -> p.ProtocolError:
        return p.ProtocolError("idle_timeout", f"No text from the client for {self.settings.stream_idle_timeout_s:g} s "
                               "while the server waited for it (appends without a letter or digit and flushes with "
                               "nothing to speak do not count); send input_text.end when the text is complete.")

    async def _next_event(self, timeout: float) -> p.ClientEvent | None:
        """The next client event; None if none came within `timeout`."""
        # Not asyncio.wait_for: on Python 3.11 it returns a message that arrives in the same loop turn
        # as the session's cancel and drops the cancel, so the receiver would poll on forever.
        try:
            async with asyncio.timeout(timeout):
                message = await self.ws.receive()
        except TimeoutError:
            return None
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        if message.get("text") is None:
            raise p.ProtocolError("binary_not_supported", "Client messages are JSON text frames; binary frames are "
                                  "not accepted.", close_code=p.UNSUPPORTED_DATA)
        return p.parse_event(message["text"], self.settings.max_body_bytes)

    def _idle_timeout(self) -> float | None:
        """Seconds the receiver may wait now; None when the server, not the client, is the one working."""
        if self.rules.ended or self.req.text.closed_segments > self.done_segments:
            return None  # waiting for audio: flushed text or the end of input is being synthesized
        return max(0.0, self.last_activity + self.settings.stream_idle_timeout_s - time.monotonic())

    async def _receive(self) -> None:
        while True:
            # Waits are short so the idle clock follows the synthesis (it stops while audio is owed).
            wait = self._idle_timeout()
            if wait == 0:
                raise self._idle_error()
            event = await self._next_event(min(wait, IDLE_POLL_S) if wait is not None else IDLE_POLL_S)
            if event is not None:
                self.rules.check(event)
                await self._feed(event)

    async def _feed(self, event: p.ClientEvent) -> None:
        """Passes the event to the text feed. Only what moves the session on (text with something to say, a
        flush that ends a segment, the end) restarts the idle clock: a client that keeps sending empty or
        blank appends, or flushes of nothing, holds its slot as surely as a silent one."""
        feed = self.req.text
        if isinstance(event, p.Append):
            if not event.text:
                return
            if self.first_text_at is None:
                self.first_text_at = time.monotonic()
            self.total_chars += len(event.text)
            self.m.stream_characters.inc(len(event.text))
            if self.ssml is not None:
                self._parse(self.ssml.feed, event.text)
                await self._apply()
            else:
                await self._push(lambda: self.lexicon.push(event.text))
            if speakable(event.text):
                self.last_activity = time.monotonic()
            return
        closed = feed.closed_segments
        if self.ssml is not None and isinstance(event, p.End):
            self._parse(self.ssml.close_document)
            await self._apply()
        await self._push(self.lexicon.flush)
        feed.flush() if isinstance(event, p.Flush) else feed.end()
        if feed.closed_segments > closed or feed.ended:
            self.last_activity = time.monotonic()

    def _parse(self, fn, *args) -> None:
        try:
            fn(*args)
        except XmlError as exc:
            raise p.ProtocolError.of(INVALID_SSML(detail=str(exc)), options=False) from None

    async def _push(self, runs: list[Run] | Callable[[], list[Run]]) -> None:
        """Text into the feed: plain runs and phone markup alike (the stream tokenizer keeps added tokens whole);
        tokenized off the loop: a message may hold 64 KiB of text (a tenth of a second or more). `runs` may be
        the lexicons' matching, which refuses a phoneme the model cannot say."""
        if callable(runs):
            try:
                runs = runs()
            except PronunciationError as exc:
                raise p.ProtocolError.of(PRONUNCIATION_UNSUPPORTED(detail=sentence(str(exc)))) from None
        text = "".join(r.text for r in runs)
        if text:
            await asyncio.get_running_loop().run_in_executor(self.s.stream_text, self.req.text.push, text)

    async def _apply(self) -> None:
        """The SSML parser's actions, in order."""
        actions = list(self.actions)  # the parser appends to this very list
        self.actions.clear()
        for a in actions:
            if isinstance(a, ssml.Say) and a.lexicons:
                await self._push(lambda: self.lexicon.push(a.text))
                continue
            await self._push(self.lexicon.flush)
            if isinstance(a, ssml.Say):
                await self._push([Run(a.text)])
            elif isinstance(a, ssml.Mark):
                await self._push([Run(a.markup)])
            elif isinstance(a, (ssml.Boundary, ssml.Silence)):
                self.req.text.flush()
                if isinstance(a, ssml.Silence):  # after the segments closed so far, whenever their audio is out
                    self.pauses.append((self.req.text.closed_segments, a.seconds))
                    self.req.out.put_nowait(_PAUSES_DUE)

    # Producing -----------------------------------------------------------------------------------------
    def _queue(self, frame: str | bytes, audio: bool = False, text_end_at: float | None = None) -> None:
        self.outbox.append((frame, audio, text_end_at))
        self.buffered += len(frame)
        self.wake.set()
        bound = self.settings.stream_send_buffer_bytes
        # while the transport takes writes the sender empties the outbox at once: only a paused one waits on the client
        if self._held() > bound and (self.flow is None or self.flow.paused()):
            raise _SlowConsumer(f"more than {bound} bytes were waiting to be sent")

    def _held(self) -> int:
        """Bytes held for this client and not taken: its outbox, its connection's write buffer and kernel queue."""
        return self.buffered + (self.flow.buffered() if self.flow is not None else 0)

    def _queue_event(self, event: dict) -> None:
        self._queue(json.dumps(event))

    def _queue_audio(self, data: bytes) -> None:
        if self.header:
            data, self.header = self.header + data, b""
        if not data:
            return
        if self.options.stream_format == "json":
            self._queue(json.dumps({"type": "speech.audio.delta", "segment": self.done_segments,
                                    "audio": base64.b64encode(data).decode()}), audio=True)
        else:
            self._queue(data, audio=True)

    async def _encode(self, audio: np.ndarray | None) -> bytes:
        """Model audio (None: the end of the stream) to the session's format and rate."""
        def work() -> bytes:
            if audio is None:
                tail = self.resampler.close() if self.resampler else np.zeros(0, np.float32)
                return (self.encoder.chunk(tail) if len(tail) else b"") + self.encoder.close()
            chunk = self.resampler.chunk(audio) if self.resampler else audio
            return self.encoder.chunk(chunk) if len(chunk) else b""

        # compressed formats and resampling cost milliseconds: off the event loop on the encoders' threads,
        # as the HTTP path
        if FORMATS[self.options.response_format].muxer is None and self.resampler is None:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self.s.encoders, work)

    async def _pump(self) -> None:
        # The scheduler ends every session with Done, its own deadline (text must become audio within
        # the request timeout of arriving) and KV bound included.
        while True:
            item = await self.req.out.get()
            if isinstance(item, np.ndarray):
                self.total_samples += len(item)
                self.last_activity = time.monotonic()
                self._queue_audio(await self._encode(item))
            elif isinstance(item, SegmentDone):
                self._segment_done(item)
                await self._pauses_due()
            elif item is _PAUSES_DUE:
                await self._pauses_due()
            elif isinstance(item, Done):
                await self._finish(item)
                return

    def _segment_done(self, item: SegmentDone) -> None:
        self.usage_tokens[0] += item.text_tokens
        self.usage_tokens[1] += item.speech_tokens
        seg = self.req.text.info(item.segment)
        text = self.s.pipeline.frontend.tokenizer.decode(seg.tokens, skip_special_tokens=False) if seg.tokens else ""
        start, self.segment_start = self.segment_start, self.total_samples
        self._queue(json.dumps({"type": "speech.segment.done", "segment": item.segment, "auto": item.auto,
                                **p.segment_times(text, start, self.total_samples, self.s.pipeline.sample_rate),
                                "usage": p.usage(seg.chars, item.audio_seconds, item.text_tokens, item.speech_tokens)}),
                    text_end_at=item.closed_at)
        self.done_segments = item.segment + 1
        self.last_activity = time.monotonic()

    async def _pauses_due(self) -> None:
        """The silence of each break whose segments before it are all out, with its segment event."""
        while self.pauses and self.pauses[0][0] <= self.done_segments:
            _, seconds = self.pauses.popleft()
            silence = np.zeros(round(seconds * self.s.pipeline.sample_rate), np.float32)
            self.total_samples += len(silence)
            self._queue_audio(await self._encode(silence))
            start, self.segment_start = self.segment_start, self.total_samples
            self._queue_event({"type": "speech.segment.done", "segment": None, "break": True, "auto": False,
                               **p.segment_times("", start, self.total_samples, self.s.pipeline.sample_rate),
                               "usage": p.usage(0, seconds)})
            self.last_activity = time.monotonic()

    async def _finish(self, item: Done) -> None:
        refused = synthesis.ended(self.s, item.outcome, item.message, streamed_text=True)
        if refused is not None:
            raise _Ended(refused.code, item.outcome, p.ProtocolError.of(refused, options=False))
        self._queue_audio(await self._encode(None))
        self._queue_event({"type": "speech.audio.done", "usage": p.usage(
            self.total_chars, self.total_samples / self.s.pipeline.sample_rate, *self.usage_tokens)})
        self.pump_done.set()
        self.wake.set()

    # Sending -------------------------------------------------------------------------------------------
    async def _send(self) -> None:
        while True:
            while not self.outbox:
                if self.pump_done.is_set():
                    return  # everything, speech.audio.done included, is out
                self.wake.clear()
                await self.wake.wait()
            frame, audio, text_end_at = self.outbox[0]
            timeout = self.settings.stream_send_timeout_s
            try:  # the send waits only while the transport is paused, i.e. for the client to read
                async with asyncio.timeout(timeout):
                    await (self.ws.send_bytes(frame) if isinstance(frame, bytes) else self.ws.send_text(frame))
            except TimeoutError:
                raise _SlowConsumer(f"it took none of the audio waiting for it for {timeout:g} s") from None
            self.outbox.popleft()
            self.buffered -= len(frame)
            if text_end_at is not None:
                self.m.stream_audio_lag.observe(time.monotonic() - text_end_at)
            if audio and not self.first_audio_sent:
                self.first_audio_sent = True
                if self.first_text_at is not None:
                    self.m.stream_ttfa.observe(time.monotonic() - self.first_text_at)

    # Ending --------------------------------------------------------------------------------------------
    async def _stop(self, tasks: list[asyncio.Task]) -> None:
        """Cancels the session's tasks and waits for them, boundedly: the session ends whatever they do."""
        for t in tasks:
            t.cancel()
        done, stuck = await asyncio.wait(tasks, timeout=FINAL_SEND_TIMEOUT_S)
        for t in done:  # retrieved here; the first one to end is what the session reports
            if not t.cancelled():
                t.exception()
        if stuck:
            log.error("%s: %s did not stop when cancelled", self.id, ", ".join(t.get_name() for t in stuck))

    async def _fail(self, error: p.ProtocolError) -> None:
        """Drops what was not sent, sends the error event and closes with its code, within a bounded time."""
        self.outbox.clear()
        self.buffered = 0
        await self._close(error.close_code, error.code, FINAL_SEND_TIMEOUT_S, json.dumps(error.event()))

    async def _close(self, code: int, reason: str, timeout: float, last_event: str | None = None) -> bool:
        """Sends `last_event` and the close frame; False when the client took neither within `timeout`, and
        its connection (with all that was buffered for it) was aborted."""
        try:
            async with asyncio.timeout(timeout):
                if last_event is not None:
                    await self.ws.send_text(last_event)
                await self.ws.close(code, reason)
        except TimeoutError:
            if self.flow is not None:
                self.flow.abort()
            return False
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # it already left
        return True


_PAUSES_DUE = object()  # put on the request's output by the receiver: a break may be due now


class _Ended(Exception):
    """The synthesis ended otherwise than with all its audio: the session's reason and error event."""

    def __init__(self, reason: str, outcome: Outcome, error: p.ProtocolError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.outcome = outcome
        self.error = error

