"""The OpenAI-compatible routes: POST /v1/audio/speech, GET /v1/models[/{model}] (voices: api/voices.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from concurrent.futures.process import BrokenProcessPool
from typing import get_args

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from pydantic import ValidationError

from .. import synthesis
from ..audio import FORMATS, StreamEncoder, encode
from ..refusals import (BODY_COMPRESSED, BODY_DECLARED_TOO_LARGE, BODY_TOO_LARGE, JSON_TOO_DEEP, NOT_AN_OBJECT, NOT_JSON,
                        TEXT_WORKER_DIED, Refusal)
from ..scheduling.request import Done, Outcome, SegmentEnd, SynthesisRequest
from ..scheduling.scheduler import Overloaded
from ..state import ServerState
from ..timeline import Timeline
from .auth import require_api_key
from .errors import body_error, validation_message
from .schemas import ErrorResponse, ModelCapabilities, ModelCard, ModelList, SpeechRequest, TimedSpeech

log = logging.getLogger(__name__)


def state_of(request: Request) -> ServerState:
    return request.app.state.server


_ERRORS = {
    400: "Invalid request: malformed JSON, a missing or invalid field (`param` names it), an unknown voice or "
         "lexicon, instructions for a voice or model that cannot take them, SSML this server does not speak, a "
         "pronunciation the model cannot say",
    401: "An API key is configured and `Authorization: Bearer <key>` is missing or wrong",
    404: "Unknown model",
    408: "The request body did not arrive within the server's body timeout",
    413: "The request body is over the server's limit",
    415: "The request body is compressed (`Content-Encoding`); send it uncompressed",
    429: "The server is full (`server_overloaded`), or HTTP requests hold all the capacity they may "
         "(`http_share_full`); `Retry-After` says when to retry",
    500: "Synthesis failed on the server",
    503: "The model is loading, the server is draining, its drain timeout cut the request off, or a worker process "
         "stopped and was restarted; `Retry-After` says when to retry",
    504: "Synthesis did not finish within the request timeout",
}


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """OpenAPI entries for the error statuses a route answers, all in OpenAI's error shape."""
    return {status: {"model": ErrorResponse, "description": _ERRORS[status]} for status in statuses}


def _inline(schema: dict) -> dict:
    """A pydantic schema with its $defs substituted, so it is valid where it is embedded in the OpenAPI document."""
    defs = schema.pop("$defs", {})

    def sub(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return sub(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: sub(v) for k, v in node.items()}
        return [sub(v) for v in node] if isinstance(node, list) else node

    return sub(schema)


router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=error_responses(401))


def ready_or_503(state: ServerState) -> None:
    if (refused := synthesis.ready(state)) is not None:
        raise refused


def _model_card(s: ServerState) -> ModelCard:
    p = s.pipeline
    if p is None:
        return ModelCard(id=s.model_id, created=s.created)
    caps = ModelCapabilities(
        family=p.manifest.family, sample_rate=p.sample_rate, response_formats=list(get_args(SpeechRequest.model_fields["response_format"].annotation)),
        stream_formats=list(get_args(SpeechRequest.model_fields["stream_format"].annotation)),
        instructions=p.frontend.takes_instructions, tags=p.frontend.markup_tags, voice_cloning=s.extraction is not None,
        phone_alphabets=p.frontend.phones.alphabets,
        input_formats=list(get_args(SpeechRequest.model_fields["input_format"].annotation)))
    return ModelCard(id=s.model_id, created=s.created, capabilities=caps)


@router.get("/models", responses={200: {"model": ModelList}})
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse(ModelList(data=[_model_card(state_of(request))]).model_dump())


@router.get("/models/{model:path}", responses={200: {"model": ModelCard}, **error_responses(404)})
async def get_model(request: Request, model: str) -> JSONResponse:
    """The served model; OpenAI's TTS model names stand for it, as in POST /v1/audio/speech."""
    s = state_of(request)
    if not synthesis.serves(s, model):
        raise synthesis.unknown_model(s, model)
    return JSONResponse(_model_card(s).model_dump())


# uptime probes often check with HEAD; GET's handler answers it (the server sends no body)
router.add_api_route("/models", list_models, methods=["HEAD"], include_in_schema=False)


async def _read_body(request: Request, limit: int) -> bytes:
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # read as JSON it would only be "not valid JSON"
        raise BODY_COMPRESSED(encoding=encoding)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BODY_DECLARED_TOO_LARGE(declared=declared, limit=limit)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise BODY_TOO_LARGE(limit=limit)
    return bytes(body)


def _parse(body: bytes) -> SpeechRequest:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise NOT_JSON() from None
    except RecursionError:
        raise JSON_TOO_DEEP() from None
    if not isinstance(data, dict):
        raise NOT_AN_OBJECT()
    try:
        return SpeechRequest.model_validate(data)
    except ValidationError as exc:
        raise body_error(*validation_message(exc.errors())) from None


class _Timeout(Exception):
    pass


class _Disconnected(Exception):
    """The client hung up; an ordinary event, not an error to log with a traceback."""


async def _next(req: SynthesisRequest, request: Request | None) -> np.ndarray | SegmentEnd | Done:
    """Next audio chunk or the end marker; raises _Timeout at the deadline. Without a stream to write
    to, the client's disconnect is noticed by polling the connection before each chunk and every
    0.25 s (chunks arrive back to back while audio flows, so polling only on idle waits misses it)."""
    while True:
        if request is not None and await request.is_disconnected():
            raise _Disconnected
        remaining = req.deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout
        # Not asyncio.wait_for: on Python 3.11 it returns a chunk that arrives in the same loop turn as the
        # task's cancel and drops the cancel (the chunk stays queued if the cancel wins instead).
        try:
            async with asyncio.timeout(min(remaining, 0.25) if request else remaining):
                return await req.out.get()
        except TimeoutError:
            continue


@router.post(
    "/audio/speech",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _inline(SpeechRequest.model_json_schema())}}}},
    responses={
        200: {"description": "The audio, streamed as it is generated unless `stream` is false; with `stream_format: "
                             "sse`, `speech.audio.delta` events (and with `timestamps: segment`, a `speech.segment` "
                             "event after each segment's audio) then `speech.audio.done`; with `stream: false` and "
                             "`timestamps: segment`, JSON `{audio (base64), format, segments}`",
              "content": {f.media_type: {"schema": {"type": "string", "format": "binary"}} for f in FORMATS.values()}
              | {"text/event-stream": {"schema": {"type": "string"}}}
              | {"application/json": {"schema": _inline(TimedSpeech.model_json_schema())}}},
        **error_responses(400, 404, 408, 413, 415, 429, 500, 503, 504),
    },
)
async def create_speech(request: Request) -> Response:
    s = state_of(request)
    started = time.monotonic()
    try:
        ready_or_503(s)  # before the body is read
        body = _parse(await _read_body(request, s.settings.max_body_bytes))
        voice = await synthesis.resolve(s, body)
        if isinstance(voice, Refusal):
            raise voice
        plan = synthesis.planned(s, body.input, body.input_format, body.lexicons, body.speed)
        if isinstance(plan, Refusal):
            raise plan
        with s.scheduler.admission() as submit:  # a slot first: a full server refuses before normalising
            try:
                items = await s.text.plan(plan)
            except BrokenProcessPool:
                raise TEXT_WORKER_DIED() from None
            req = synthesis.whole_text(s, body, voice, items)
            if isinstance(req, Refusal):
                raise req
            submit(req)
    except ClientDisconnect:  # hung up while sending the body: nothing was accepted, nobody reads an answer
        s.record(499, started)
        return Response(status_code=499)
    except Overloaded as exc:
        s.record(429, started)
        raise synthesis.overloaded(exc) from None
    except Refusal as exc:
        s.record(exc.status, started)
        raise
    headers = {"X-Request-Id": str(req.id)}
    timeline = Timeline(items, s.pipeline.sample_rate)
    chunks: list[np.ndarray] = []
    segments: list[dict] = []
    outcome, streaming, item = Outcome.CANCELLED, False, None
    try:
        # A stream starts with its first audio, not before: until then a failure or timeout still gets its
        # status code and error body instead of a 200 with nothing in it.
        item = await _next(req, request)
        if body.stream and not isinstance(item, Done):
            streaming = True  # the stream now owns the request and releases it
            return _SpeechStream(_stream(s, req, body, started, item, timeline), headers=headers,
                                 media_type="text/event-stream" if body.stream_format == "sse" else FORMATS[body.response_format].media_type)
        audio, events = timeline.begin()
        chunks.append(audio)
        segments += events
        while not isinstance(item, Done):
            audio, events = _placed(timeline, item)
            chunks.append(audio)
            segments += events
            item = await _next(req, request)
        outcome = item.outcome
    except _Timeout:
        outcome = Outcome.TIMEOUT
    except _Disconnected:
        pass  # outcome stays CANCELLED
    finally:
        if not streaming:
            req.cancel()  # nothing if it has ended
    if outcome == Outcome.CANCELLED:
        s.record(499, started)
        return Response(status_code=499)  # nobody reads it: the connection is gone
    refused = synthesis.ended(s, outcome, item.message if isinstance(item, Done) else None)
    if refused is not None:
        s.record(refused.status, started)
        raise refused
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    data = await _encoded(s, body.response_format, encode, audio, s.pipeline.sample_rate, body.response_format)
    s.record(200, started)
    headers |= {"X-Speech-Tokens": str(len(req.tokens)), "X-Audio-Duration-Seconds": f"{len(audio) / s.pipeline.sample_rate:.3f}"}
    if req.first_audio_at is not None:
        headers["X-Time-To-First-Audio-Ms"] = f"{(req.first_audio_at - req.created) * 1000:.1f}"
    if body.timestamps == "segment":
        return JSONResponse({"audio": base64.b64encode(data).decode(), "format": body.response_format,
                             "segments": segments}, headers=headers)
    return Response(data, media_type=FORMATS[body.response_format].media_type, headers=headers)


def _placed(timeline: Timeline, item: np.ndarray | SegmentEnd) -> tuple[np.ndarray, list[dict]]:
    """A chunk of audio as it goes out, or at a segment's end the silence of the breaks after it; the events of
    the segments and breaks that end there."""
    if isinstance(item, SegmentEnd):
        return timeline.segment_end()
    timeline.audio(len(item))
    return item, []


async def _encoded(s: ServerState, fmt: str, fn, *args) -> bytes:
    """Compressed formats encode off the event loop (milliseconds per second of audio), so other streams keep
    flowing, on the encoders' own threads (state.py)."""
    if FORMATS[fmt].muxer is None:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(s.encoders, fn, *args)


def _sse(event: dict) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


_BROKEN = object()  # yielded last when a raw audio stream must not end as if complete


class _SpeechStream(StreamingResponse):
    """A raw audio stream whose synthesis fails part-way ends without its closing chunk, so the client sees
    a broken transfer (httpx: "incomplete chunked read") instead of a complete but truncated file. SSE
    streams end normally: they carry an `error` event instead."""

    async def stream_response(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            if chunk is _BROKEN:
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _stream(s: ServerState, req: SynthesisRequest, body: SpeechRequest, started: float,
                  first: np.ndarray | SegmentEnd, timeline: Timeline):
    enc = StreamEncoder(body.response_format, s.pipeline.sample_rate)
    sse = body.stream_format == "sse"
    timed = sse and body.timestamps == "segment"
    outcome, code = Outcome.CANCELLED, 499  # until it ends otherwise, the client went away

    def out(data: bytes) -> bytes:
        return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}) if sse else data

    async def send(audio: np.ndarray, events: list[dict]):
        nonlocal pending
        data = pending + (await _encoded(s, enc.fmt, enc.chunk, audio) if len(audio) else b"")
        pending = b""
        if data:
            yield out(data)
        if timed:  # after the audio they time
            for event in events:
                yield _sse({"type": "speech.segment", **event})

    try:
        pending = enc.header()
        async for part in send(*timeline.begin()):
            yield part
        item = first
        while not isinstance(item, Done):
            async for part in send(*_placed(timeline, item)):
                yield part
            item = await _next(req, None)
        outcome = item.outcome
        tail = pending + await _encoded(s, enc.fmt, enc.close)
        if tail:
            yield out(tail)
        refused = synthesis.ended(s, outcome, item.message)
        if refused is not None:
            code = refused.status
            if sse:
                yield _sse({"type": "error", "error": refused.error()})
        else:
            code = 200
            if sse:
                n_in = req.text.input_tokens
                yield _sse({"type": "speech.audio.done", "usage": {"input_tokens": n_in, "output_tokens": len(req.tokens),
                                                                   "total_tokens": n_in + len(req.tokens)}})
    except _Timeout:
        outcome, code = Outcome.TIMEOUT, 504
        if sse:
            yield _sse({"type": "error", "error": synthesis.ended(s, outcome, None).error()})
    finally:
        req.cancel()  # nothing if it has ended
        s.record(code, started)
    if code in (500, 503, 504) and not sse:
        log.warning("request %s: %s after its audio began; the stream is cut short", req.id,
                    {500: "synthesis failed", 503: "the drain timeout passed", 504: "the deadline passed"}[code])
        yield _BROKEN
