"""The OpenAI-compatible routes: POST /v1/audio/speech, GET /v1/audio/voices, GET /v1/models."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from ..audio import FORMATS, STREAMABLE, StreamEncoder, encode
from ..scheduling.request import Done, Outcome, SynthesisRequest
from ..scheduling.scheduler import Overloaded
from ..state import ServerState
from .errors import APIError, validation_message
from .schemas import ModelCard, SpeechRequest, VoiceCard

OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def state_of(request: Request) -> ServerState:
    return request.app.state.server


async def require_api_key(request: Request) -> None:
    key = state_of(request).api_key
    if key is None:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or token.strip() != key:
        raise APIError(401, "Missing or incorrect API key: send 'Authorization: Bearer <key>'.",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


def _ready(state: ServerState) -> None:
    if state.draining:
        raise APIError(503, "The server is shutting down; retry on another replica.", type="server_error",
                       code="shutting_down", headers={"Retry-After": "1"})
    if not state.ready:
        raise APIError(503, "The model is still loading; retry shortly.", type="server_error", code="model_loading",
                       headers={"Retry-After": "5"})


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    s = state_of(request)
    return JSONResponse({"object": "list", "data": [ModelCard(id=s.model_id, created=s.created).model_dump()]})


@router.get("/audio/voices")
async def list_voices(request: Request) -> JSONResponse:
    s = state_of(request)
    _ready(s)
    voices = [VoiceCard(id=v.name, name=v.name, prompt_speech_tokens=len(v.prompt_speech_tokens)).model_dump()
              for v in s.pipeline.voices.values()]
    return JSONResponse({"object": "list", "default": s.pipeline.manifest.voices.default, "voices": voices})


async def _read_body(request: Request, limit: int) -> bytes:
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
    voices = state.pipeline.voices
    if req.voice is not None and req.voice not in voices:
        raise APIError(400, f"Unknown voice '{req.voice}'; available: {', '.join(sorted(voices))}.", param="voice",
                       code="invalid_voice")
    if req.response_format not in FORMATS:
        raise APIError(400, f"response_format '{req.response_format}' is not supported here; use one of "
                       f"{', '.join(FORMATS)}.", param="response_format", code="unsupported_format")
    if req.streaming and req.response_format not in STREAMABLE:
        raise APIError(400, f"Streaming supports response_format {', '.join(STREAMABLE)}; "
                       f"'{req.response_format}' needs the whole audio (send stream=false).",
                       param="response_format", code="unsupported_format")
    if req.instructions:
        raise APIError(400, "This model does not take 'instructions' (CosyVoice2 instruct voices are not loaded).",
                       param="instructions", code="unsupported_parameter")
    return req


class _Timeout(Exception):
    pass


async def _next(req: SynthesisRequest, request: Request | None) -> np.ndarray | Done:
    """Next audio chunk or the end marker; raises _Timeout at the deadline. Without a stream to write
    to, the client's disconnect is noticed by polling the connection between waits."""
    while True:
        remaining = req.deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout
        try:
            return await asyncio.wait_for(req.out.get(), timeout=min(remaining, 0.25) if request else remaining)
        except TimeoutError:
            if request is not None and await request.is_disconnected():
                raise asyncio.CancelledError from None


@router.post(
    "/audio/speech",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": SpeechRequest.model_json_schema()}}}},
    responses={200: {"content": {f[2]: {} for f in FORMATS.values()} | {"text/event-stream": {}}}},
)
async def create_speech(request: Request) -> Response:
    s = state_of(request)
    started = time.monotonic()
    try:
        _ready(s)
        body = _parse(await _read_body(request, s.settings.max_body_bytes), s)
        req = s.new_request(body)
        if not req.segments:
            raise APIError(400, "The input has no speakable text after normalization.", param="input", code="invalid_value")
        s.scheduler.submit(req)
    except Overloaded as exc:
        s.record(429, started)
        raise APIError(429, str(exc).capitalize() + ".", type="rate_limit_error", code="server_overloaded",
                       headers={"Retry-After": str(exc.retry_after_s)}) from None
    except APIError as exc:
        s.record(exc.status, started)
        raise
    headers = {"X-Request-Id": str(req.id)}
    if body.streaming:
        return StreamingResponse(_stream(s, req, body, started), headers=headers,
                                 media_type="text/event-stream" if body.stream_format == "sse" else FORMATS[body.response_format][2])
    chunks: list[np.ndarray] = []
    outcome = Outcome.CANCELLED
    try:
        while not isinstance(item := await _next(req, request), Done):
            chunks.append(item)
        outcome = item.outcome
    except _Timeout:
        outcome = Outcome.TIMEOUT
    finally:
        s.scheduler.release(req, outcome)
    if outcome == Outcome.TIMEOUT:
        s.record(504, started)
        raise APIError(504, f"Synthesis did not finish within the request timeout of {s.settings.request_timeout_s:g} s.",
                       type="server_error", code="timeout")
    if outcome == Outcome.FAILED:
        s.record(500, started)
        raise APIError(500, f"Synthesis failed: {item.message}.", type="server_error", code="internal_error")
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    data = encode(audio, s.pipeline.sample_rate, body.response_format)
    s.record(200, started)
    headers |= {"X-Speech-Tokens": str(len(req.tokens)), "X-Audio-Duration-Seconds": f"{len(audio) / s.pipeline.sample_rate:.3f}"}
    if req.first_audio_at is not None:
        headers["X-Time-To-First-Audio-Ms"] = f"{(req.first_audio_at - req.created) * 1000:.1f}"
    return Response(data, media_type=FORMATS[body.response_format][2], headers=headers)


def _sse(event: dict) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


async def _stream(s: ServerState, req: SynthesisRequest, body: SpeechRequest, started: float):
    enc = StreamEncoder(body.response_format, s.pipeline.sample_rate)
    sse = body.stream_format == "sse"
    outcome, code = Outcome.CANCELLED, 499  # until it ends otherwise, the client went away

    def out(data: bytes) -> bytes:
        return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}) if sse else data

    try:
        pending = enc.header()
        while not isinstance(item := await _next(req, None), Done):
            data = pending + enc.chunk(item)
            pending = b""
            if data:
                yield out(data)
        outcome = item.outcome
        tail = pending + enc.close()
        if tail:
            yield out(tail)
        if outcome == Outcome.FAILED:
            code = 500
            if sse:
                yield _sse({"type": "error", "error": {"message": f"Synthesis failed: {item.message}.", "type": "server_error",
                                                       "param": None, "code": "internal_error"}})
        else:
            code = 200
            if sse:
                n_in = sum(len(x) for x in req.segments)
                yield _sse({"type": "speech.audio.done", "usage": {"input_tokens": n_in, "output_tokens": len(req.tokens),
                                                                   "total_tokens": n_in + len(req.tokens)}})
    except _Timeout:
        outcome, code = Outcome.TIMEOUT, 504
        if sse:
            yield _sse({"type": "error", "error": {"message": f"Synthesis did not finish within {s.settings.request_timeout_s:g} s.",
                                                   "type": "server_error", "param": None, "code": "timeout"}})
    finally:
        s.scheduler.release(req, outcome)
        s.record(code, started)
