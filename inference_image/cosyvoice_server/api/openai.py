"""The OpenAI-compatible routes: POST /v1/audio/speech, GET /v1/models[/{model}] (voices: api/voices.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from concurrent.futures.process import BrokenProcessPool

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from pydantic import ValidationError

from ..audio import FORMATS, StreamEncoder, encode
from ..engine.pipeline import Voice
from ..model.manifest import ModelLoadError
from ..scheduling.request import Done, Outcome, SynthesisRequest
from ..scheduling.scheduler import Overloaded
from ..state import InstructionError, ServerState
from .auth import require_api_key
from .errors import APIError, validation_message
from .schemas import OPENAI_VOICES, ErrorResponse, ModelCard, ModelList, SpeechRequest, VoiceRef

OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")

log = logging.getLogger(__name__)


def state_of(request: Request) -> ServerState:
    return request.app.state.server


_ERRORS = {
    400: "Invalid request: malformed JSON, a missing or invalid field (`param` names it), an unknown voice, "
         "instructions for a voice or model that cannot take them",
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
    if state.draining:
        raise APIError(503, "The server is shutting down; retry on another replica.", type="server_error",
                       code="shutting_down", headers={"Retry-After": "1"})
    if not state.ready:
        raise APIError(503, "The model is still loading; retry shortly.", type="server_error", code="model_loading",
                       headers={"Retry-After": "5"})


def _model_card(s: ServerState) -> ModelCard:
    return ModelCard(id=s.model_id, created=s.created)


@router.get("/models", responses={200: {"model": ModelList}})
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse(ModelList(data=[_model_card(state_of(request))]).model_dump())


@router.get("/models/{model:path}", responses={200: {"model": ModelCard}, **error_responses(404)})
async def get_model(request: Request, model: str) -> JSONResponse:
    """The served model; OpenAI's TTS model names stand for it, as in POST /v1/audio/speech."""
    s = state_of(request)
    if model not in (s.model_id, *OPENAI_MODEL_ALIASES):
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{s.model_id}'.", param="model",
                       code="model_not_found")
    return JSONResponse(_model_card(s).model_dump())


# uptime probes often check with HEAD; GET's handler answers it (the server sends no body)
router.add_api_route("/models", list_models, methods=["HEAD"], include_in_schema=False)


async def _read_body(request: Request, limit: int) -> bytes:
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # read as JSON it would only be "not valid JSON"
        raise APIError(415, f"Content-Encoding {encoding!r} is not supported: send the JSON body uncompressed.",
                       code="unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"Request body is {declared} bytes; the limit is {limit}.", code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise APIError(413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large")
    return bytes(body)


def _parse(body: bytes, state: ServerState) -> SpeechRequest:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "The request body is not valid JSON.", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "The request body nests JSON too deeply.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    try:
        req = SpeechRequest.model_validate(data)
    except ValidationError as exc:
        msg, param, code = validation_message(exc.errors())
        raise APIError(400, msg, param=param, code=code) from None
    if req.model not in (state.model_id, *OPENAI_MODEL_ALIASES):
        raise APIError(404, f"The model '{req.model}' does not exist; this server serves '{state.model_id}'.",
                       param="model", code="model_not_found")
    if not req.stream and req.stream_format == "sse":
        raise APIError(400, "stream_format 'sse' sends events as they are generated; it cannot be combined with "
                       "stream=false.", param="stream_format", code="invalid_value")
    return req


async def _voice(state: ServerState, req: SpeechRequest) -> Voice:
    """The request's voice: bundled, an alias, or registered on any replica (read through the prompt cache)."""
    try:
        voice = await state.find_voice(req.voice_id)
    except ModelLoadError as exc:  # the store's file is damaged: the server's problem, said plainly
        raise APIError(500, f"The registered voice '{req.voice_id}' cannot be read from the voice store ({exc}); "
                       "delete and register it again.", type="server_error", code="voice_unreadable") from None
    if voice is None:
        names = sorted([*state.pipeline.voices, *state.voice_aliases])
        registered = " or a registered voice (GET /v1/audio/voices)" if state.voice_store is not None else ""
        hint = (" OpenAI's voice names work once the model or the server maps them (voices.aliases in model.yaml, "
                "or --voice-aliases alloy=<voice>).") if req.voice_id in OPENAI_VOICES else ""
        raise APIError(400, f"Unknown voice '{req.voice_id}'; available: {', '.join(names)}{registered}.{hint}",
                       param="voice.id" if isinstance(req.voice, VoiceRef) else "voice", code="invalid_voice")
    return voice


class _Timeout(Exception):
    pass


class _Disconnected(Exception):
    """The client hung up; an ordinary event, not an error to log with a traceback."""


async def _next(req: SynthesisRequest, request: Request | None) -> np.ndarray | Done:
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
                             "sse`, `speech.audio.delta` events then `speech.audio.done`",
              "content": {f.media_type: {"schema": {"type": "string", "format": "binary"}} for f in FORMATS.values()}
              | {"text/event-stream": {"schema": {"type": "string"}}}},
        **error_responses(400, 404, 408, 413, 415, 429, 500, 503, 504),
    },
)
async def create_speech(request: Request) -> Response:
    s = state_of(request)
    started = time.monotonic()
    try:
        ready_or_503(s)
        body = _parse(await _read_body(request, s.settings.max_body_bytes), s)
        voice = await _voice(s, body)
        with s.scheduler.admission() as submit:  # a slot first: a full server refuses before normalising
            try:
                segments = await s.text_segments(body.input)
            except BrokenProcessPool:
                raise APIError(503, "The text normalization process stopped (see the server log); it has been "
                               "restarted: retry.", type="server_error", code="text_worker_unavailable",
                               headers={"Retry-After": "1"}) from None
            try:
                req = s.new_request(body, voice, segments)
            except InstructionError as exc:
                raise APIError(400, str(exc), param="instructions", code="unsupported_parameter") from None
            if not req.text.segments:
                raise APIError(400, "The input has no speakable text after normalization.", param="input",
                               code="invalid_value")
            fewest, most = s.token_bounds(req.text.segments, body.speed)
            if fewest > most:
                rate = s.pipeline.manifest.token_rate * body.speed
                raise APIError(400, f"The input would make at least {fewest / rate:.1f} s of audio; the limit is "
                               f"{s.settings.max_audio_seconds:g} s per request. Split the text into several "
                               "requests.", param="input", code="input_too_long")
            submit(req)
    except ClientDisconnect:  # hung up while sending the body: nothing was accepted, nobody reads an answer
        s.record(499, started)
        return Response(status_code=499)
    except Overloaded as exc:
        s.record(429, started)
        raise APIError(429, str(exc)[:1].upper() + str(exc)[1:] + ".", type="rate_limit_error", code=exc.code,
                       headers={"Retry-After": str(exc.retry_after_s)}) from None
    except APIError as exc:
        s.record(exc.status, started)
        raise
    headers = {"X-Request-Id": str(req.id)}
    chunks: list[np.ndarray] = []
    outcome, streaming = Outcome.CANCELLED, False
    try:
        # A stream starts with its first audio, not before: until then a failure or timeout still gets its
        # status code and error body instead of a 200 with nothing in it.
        item = await _next(req, request)
        if body.stream and not isinstance(item, Done):
            streaming = True  # the stream now owns the request and releases it
            return _SpeechStream(_stream(s, req, body, started, item), headers=headers,
                                 media_type="text/event-stream" if body.stream_format == "sse" else FORMATS[body.response_format].media_type)
        while not isinstance(item, Done):
            chunks.append(item)
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
    if outcome == Outcome.TIMEOUT:
        s.record(504, started)
        raise APIError(504, f"Synthesis did not finish within the request timeout of {s.settings.request_timeout_s:g} s.",
                       type="server_error", code="timeout")
    if outcome == Outcome.SHUTDOWN:
        s.record(503, started)
        raise APIError(503, f"The server shut down before synthesis finished: {item.message}.", type="server_error",
                       code="shutting_down", headers={"Retry-After": "1"})
    if outcome == Outcome.FAILED:
        s.record(500, started)
        raise APIError(500, f"Synthesis failed: {item.message}.", type="server_error", code="internal_error")
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    data = await _encoded(s, body.response_format, encode, audio, s.pipeline.sample_rate, body.response_format)
    s.record(200, started)
    headers |= {"X-Speech-Tokens": str(len(req.tokens)), "X-Audio-Duration-Seconds": f"{len(audio) / s.pipeline.sample_rate:.3f}"}
    if req.first_audio_at is not None:
        headers["X-Time-To-First-Audio-Ms"] = f"{(req.first_audio_at - req.created) * 1000:.1f}"
    return Response(data, media_type=FORMATS[body.response_format].media_type, headers=headers)


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


async def _stream(s: ServerState, req: SynthesisRequest, body: SpeechRequest, started: float, first: np.ndarray):
    enc = StreamEncoder(body.response_format, s.pipeline.sample_rate)
    sse = body.stream_format == "sse"
    outcome, code = Outcome.CANCELLED, 499  # until it ends otherwise, the client went away

    def out(data: bytes) -> bytes:
        return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}) if sse else data

    try:
        pending, item = enc.header(), first
        while not isinstance(item, Done):
            data = pending + await _encoded(s, enc.fmt, enc.chunk, item)
            pending = b""
            if data:
                yield out(data)
            item = await _next(req, None)
        outcome = item.outcome
        tail = pending + await _encoded(s, enc.fmt, enc.close)
        if tail:
            yield out(tail)
        if outcome in (Outcome.FAILED, Outcome.SHUTDOWN):
            code, err = (500, "internal_error") if outcome == Outcome.FAILED else (503, "shutting_down")
            if sse:
                yield _sse({"type": "error", "error": {"message": f"Synthesis failed: {item.message}.", "type": "server_error",
                                                       "param": None, "code": err}})
        else:
            code = 200
            if sse:
                n_in = req.text.input_tokens
                yield _sse({"type": "speech.audio.done", "usage": {"input_tokens": n_in, "output_tokens": len(req.tokens),
                                                                   "total_tokens": n_in + len(req.tokens)}})
    except _Timeout:
        outcome, code = Outcome.TIMEOUT, 504
        if sse:
            yield _sse({"type": "error", "error": {"message": f"Synthesis did not finish within {s.settings.request_timeout_s:g} s.",
                                                   "type": "server_error", "param": None, "code": "timeout"}})
    finally:
        req.cancel()  # nothing if it has ended
        s.record(code, started)
    if code in (500, 503, 504) and not sse:
        log.warning("request %s: %s after its audio began; the stream is cut short", req.id,
                    {500: "synthesis failed", 503: "the drain timeout passed", 504: "the deadline passed"}[code])
        yield _BROKEN
