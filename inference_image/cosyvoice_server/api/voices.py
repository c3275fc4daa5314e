"""Voices: list the bundled and registered ones, register a voice from a clip, show and delete one.

    GET    /v1/audio/voices          every voice a request can name
    POST   /v1/audio/voices          multipart `name`, `audio` (wav/flac/mp3/ogg), optional `transcript` -> 201
    GET    /v1/audio/voices/{name}
    DELETE /v1/audio/voices/{name}

Registering and deleting need `--allow-voice-registration` and, when a registration key is configured,
that key (the synthesis key is refused with 403). A voice records its owner, the registering key's
identity (api/auth.py): only that key, or the admin key, may delete it; a voice with no owner
(registered before owners were recorded) only the admin key. Transcripts and owners are shown to the
registration and admin keys only. `--max-voices-per-owner` and `--max-registered-voices` bound the store.
The clip is decoded and its features extracted in worker processes at a lower CPU priority and under an
address-space limit (voices/worker.py), never in the server process; when every worker is busy a
registration gets 429 at once. A registration not extracted within the server's
`voice_registration_timeout_s` (synthesis takes the CPU first) gets 503 and its worker is replaced. The
server's part (store checks, waiting for the worker, the write) runs on threads of its own
(`state.registrations`), never the event loop's default executor.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as StarletteRequest

from ..refusals import (AUDIO_NOT_A_FILE, BUNDLED_VOICE, DRAINING_NOTHING_STORED, EXTRACTION_FAILED,
                        EXTRACTION_WORKER_DIED, FORM_NOT_MULTIPART, FORM_UNPARSABLE, INSUFFICIENT_SCOPE,
                        INVALID_VOICE_NAME, MISSING_PARAMETER, NAME_TAKEN, NAME_TAKEN_BY_BUNDLED, NAME_TAKEN_MEANWHILE,
                        NOT_VOICE_OWNER, OWNER_QUOTA, REGISTRATION_BUSY, REGISTRATION_OFF, REGISTRATION_TIMEOUT,
                        STORE_FULL, STORE_WRITE_FAILED, TRANSCRIPT_NOT_TEXT, TRANSCRIPT_TOO_LONG, UPLOAD_TOO_LARGE,
                        VOICE_NOT_FOUND, VOICE_RECORD_UNREADABLE, Refusal)
from ..state import ServerState
from ..voices import clip
from ..voices.features import ClipError
from ..voices.store import NAME_PATTERN, UnreadableRecord, VoiceExists, VoiceRecord, valid_name
from ..voices.worker import ExtractionFailed, ExtractionTimeout, PoolClosed, WorkerDied
from .auth import VoiceCaller, presented_tokens, unauthorized, voice_caller
from .openai import ready_or_503, state_of
from .schemas import ErrorResponse, VoiceCard, VoiceList

log = logging.getLogger(__name__)

MAX_TRANSCRIPT_CHARS = 2048
# Room for the multipart boundaries, headers and the text fields around the file.
FORM_OVERHEAD_BYTES = 64 * 1024
# After a registration timed out: its worker is being replaced (a few seconds), and the CPU was saturated.
TIMEOUT_RETRY_AFTER_S = 10


def _errors(**described: str) -> dict[int | str, dict]:
    return {int(status.removeprefix("e")): {"model": ErrorResponse, "description": text}
            for status, text in described.items()}


def caller_of(request: Request) -> VoiceCaller:
    """The request's role among the voices (a dependency; 401 when an API key is in force and none is presented)."""
    s = state_of(request)
    keys = [None if k is None else k.current() for k in (s.api_key, s.registration_key, s.admin_key)]
    caller = voice_caller(presented_tokens(request.headers.getlist("authorization")), *keys,
                          registration_open=s.settings.allow_voice_registration,
                          owner_name=s.settings.voice_registration_owner)
    if caller is None:
        raise unauthorized()
    return caller


router = APIRouter(prefix="/v1", dependencies=[Depends(caller_of)], tags=["voices"],
                   responses=_errors(e401="An API key is configured and `Authorization: Bearer <key>` is missing or wrong",
                                     e503="The model is loading or the server is draining; retry shortly"))

_SCOPE_ERRORS = _errors(e403="Voice registration is off on this server, or the key is not the registration key")


def _card(s: ServerState, voice) -> VoiceCard:
    return VoiceCard(id=voice.name, name=voice.name, type="bundled",
                     mode="zero_shot" if len(voice.prompt_speech_tokens) else "sft",
                     prompt_speech_tokens=len(voice.prompt_speech_tokens),
                     aliases=sorted(a for a, t in s.voice_aliases.items() if t == voice.name))


def _registered_card(rec: VoiceRecord) -> VoiceCard:
    return VoiceCard(id=rec.name, name=rec.name, type="registered", mode=rec.mode,
                     prompt_speech_tokens=rec.prompt_speech_tokens, created_at=rec.created_at, transcript=rec.transcript,
                     duration_seconds=rec.duration_seconds, sample_rate=rec.sample_rate, samples=rec.samples,
                     owner=rec.owner)


def _hidden(caller: VoiceCaller) -> set[str] | None:
    """The card fields `caller` may not see: a transcript is what a speaker said, personal data for the keys
    that manage voices, not for every client that synthesizes."""
    return None if caller.sees_transcripts else {"transcript", "owner"}


@router.get("/audio/voices", responses={200: {"model": VoiceList}})
async def list_voices(request: Request, caller: VoiceCaller = Depends(caller_of)) -> JSONResponse:
    s = state_of(request)
    ready_or_503(s)
    voices = [_card(s, v) for v in s.pipeline.voices.values()]
    if s.voice_store is not None:
        voices += [_registered_card(r) for r in await s.on_store(s.voice_store.records)]
    listing = VoiceList(default=s.pipeline.manifest.voices.default, voices=voices)
    hidden = _hidden(caller)
    return JSONResponse(listing.model_dump(exclude=hidden and {"voices": {"__all__": hidden}}))


@router.get("/audio/voices/{name}", responses={200: {"model": VoiceCard}, **_errors(
    e404="No voice of that name", e500="The voice is in the store but its record cannot be read (code "
    "`voice_unreadable`; the message says why); it is left out of the listing")})
async def get_voice(request: Request, name: str, caller: VoiceCaller = Depends(caller_of)) -> JSONResponse:
    s = state_of(request)
    ready_or_503(s)
    bundled = s.voice(name)
    if bundled is not None:
        return JSONResponse(_card(s, s.pipeline.voices[bundled]).model_dump(exclude=_hidden(caller)))
    rec = await _record(s, name)
    if rec is None:
        raise _not_found(name)
    return JSONResponse(_registered_card(rec).model_dump(exclude=_hidden(caller)))


async def _record(s: ServerState, name: str) -> VoiceRecord | None:
    """A registered voice's record, None if there is none; a damaged one is the server's 500, said plainly."""
    if s.voice_store is None:
        return None
    try:
        return await s.on_store(s.voice_store.record, name)
    except UnreadableRecord as exc:
        raise VOICE_RECORD_UNREADABLE(name=name, detail=exc.detail) from None


def _not_owner(name: str, why: str) -> Refusal:
    return NOT_VOICE_OWNER(name=name, why=why)


def _not_found(name: str) -> Refusal:
    return VOICE_NOT_FOUND(name=name)


def _registration_on(request: Request) -> None:
    if not state_of(request).settings.allow_voice_registration:
        raise REGISTRATION_OFF()


def _insufficient_scope(message: str) -> Refusal:
    return INSUFFICIENT_SCOPE(detail=message)


def require_registration(request: Request, caller: VoiceCaller = Depends(caller_of)) -> None:
    """Registration is on, and the caller holds the registration key when one is configured."""
    _registration_on(request)
    if caller.admin and not caller.register:
        raise _insufficient_scope("The voice admin key deletes voices but does not register them; use the voice "
                                  "registration key.")
    if not caller.register:
        raise _insufficient_scope("This key may synthesize speech but not register or delete voices; use the voice "
                                  "registration key.")


def require_deletion(request: Request, caller: VoiceCaller = Depends(caller_of)) -> None:
    """Registration is on, and the caller holds the registration key (for its own voices) or the admin key."""
    _registration_on(request)
    if not (caller.register or caller.admin):
        raise _insufficient_scope("This key may synthesize speech but not register or delete voices; use the voice "
                                  "registration key (for the voices it registered) or the voice admin key.")


@router.delete("/audio/voices/{name}", dependencies=[Depends(require_deletion)],
               responses={**_errors(e403="Voice registration is off on this server, the key is neither the "
                                         "registration nor the admin key (`insufficient_scope`), or the voice is "
                                         "not the registration key's own (`not_voice_owner`)",
                                    e404="No registered voice of that name",
                                    e409="A bundled voice or alias (cannot be deleted)")})
async def delete_voice(request: Request, name: str, caller: VoiceCaller = Depends(caller_of)) -> JSONResponse:
    s = state_of(request)
    ready_or_503(s)
    if s.voice(name) is not None:
        raise BUNDLED_VOICE(name=name)
    if not caller.admin:
        try:
            rec = await s.on_store(s.voice_store.record, name)
        except UnreadableRecord:
            raise _not_owner(name, "its record cannot be read, so its owner is unknown") from None
        if rec is None:
            raise _not_found(name)
        if rec.owner != caller.owner:
            raise _not_owner(name, "it was registered before voices had owners" if rec.owner is None
                             else "another key registered it")
    if not await s.on_store(s.voice_store.delete, name):
        raise _not_found(name)
    log.info("voice %s deleted by %s", name, "the admin key" if caller.admin else caller.owner)
    return JSONResponse({"id": name, "object": "voice.deleted", "deleted": True})


@router.post(
    "/audio/voices", status_code=201, dependencies=[Depends(require_registration)],
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["name", "audio"], "properties": {
            "name": {"type": "string", "pattern": f"^{NAME_PATTERN}$", "description": "the voice's name in requests"},
            "audio": {"type": "string", "format": "binary", "description": f"a mono clip of {clip.MIN_SECONDS:g}-"
                      f"{clip.MAX_SECONDS:g} s at {clip.MIN_SAMPLE_RATE // 1000}-{clip.MAX_SAMPLE_RATE // 1000} kHz: wav, "
                      "flac, mp3 or ogg"},
            "transcript": {"type": "string", "maxLength": MAX_TRANSCRIPT_CHARS, "description": "what the clip says; "
                           "without it the voice is cross-lingual"}}}}}}},
    responses={201: {"model": VoiceCard}, **_SCOPE_ERRORS, **_errors(
        e400="A missing or invalid field (`param` names it) or a clip or transcript that cannot make a voice (`code` "
             "says why)",
        e409="The name is taken (by a registered or a bundled voice, `voice_exists`), the key's owner has "
             "`max_voices_per_owner` voices (`voice_quota_exceeded`) or the store `max_registered_voices` "
             "(`voice_store_full`)",
        e413="The upload is over the server's limit",
        e415="The body is not multipart/form-data",
        e429="Every registration slot is busy; `Retry-After` says when to retry",
        e500="The voice store could not be written, or the extraction failed for a reason not the clip's (nothing "
             "stored)",
        e503="The model is loading, the server is draining, the extraction process stopped, or the voice was not "
             "extracted within the server's registration timeout (nothing stored); `Retry-After` says when to retry")},
)
async def register_voice(request: Request, caller: VoiceCaller = Depends(caller_of)) -> JSONResponse:
    s = state_of(request)
    started = time.monotonic()
    form = None
    try:
        ready_or_503(s)
        form = await _form(request, s.settings.max_voice_upload_bytes)
        name, upload, transcript = _fields(s, form)
        pool = s.extraction
        if pool.busy >= pool.size:
            raise REGISTRATION_BUSY(busy=pool.busy)
        pool.busy += 1  # so at most `size` run, each on one of state.registrations' `size` threads
        deadline = time.monotonic() + s.settings.voice_registration_timeout_s
        try:
            rec = await asyncio.get_running_loop().run_in_executor(
                s.registrations, functools.partial(_register, s, name, upload, transcript, deadline, owner=caller.owner))
        finally:
            pool.busy -= 1
    except Refusal as exc:
        s.metrics.voice_registrations.labels(exc.code or str(exc.status)).inc()
        raise
    except ClientDisconnect:
        s.metrics.voice_registrations.labels("client_disconnected").inc()
        return Response(status_code=499)  # hung up while sending the clip: nobody reads an answer
    except Exception:  # answered as a 500 by the app's handler; counted here
        s.metrics.voice_registrations.labels("internal_error").inc()
        raise
    finally:
        if form is not None:
            await form.close()  # the spooled upload's temporary file
    s.metrics.voice_registrations.labels("ok").inc()
    s.metrics.voice_registration_duration.observe(time.monotonic() - started)
    log.info("voice %s registered (%s, %.1f s clip)", rec.name, rec.mode, rec.duration_seconds)
    return JSONResponse(_registered_card(rec).model_dump(), status_code=201,
                        headers={"Location": f"/v1/audio/voices/{rec.name}"})


async def _form(request: Request, limit: int):
    """The multipart form, read with the upload bound enforced as the bytes arrive (a declared length over
    it is refused before any are read); the file part spools to disk, not memory."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise FORM_NOT_MULTIPART()
    bound = limit + FORM_OVERHEAD_BYTES
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > bound:
        raise _too_large(limit, int(declared))
    seen = 0

    async def receive():
        nonlocal seen
        message = await request.receive()
        seen += len(message.get("body", b""))
        if seen > bound:
            raise _too_large(limit, None)
        return message

    try:
        return await StarletteRequest(request.scope, receive).form(max_files=1, max_fields=8)
    except (HTTPException, MultiPartException) as exc:  # a malformed body is the client's mistake
        detail = str(getattr(exc, "detail", None) or getattr(exc, "message", exc)).rstrip(".")
        raise FORM_UNPARSABLE(detail=detail) from None


def _too_large(limit: int, declared: int | None) -> Refusal:
    return UPLOAD_TOO_LARGE(size=f" ({declared} bytes)" if declared is not None else "", limit=limit)


def _fields(s: ServerState, form) -> tuple[str, UploadFile, str | None]:
    name = form.get("name")
    if name is None:
        raise MISSING_PARAMETER(name="name", param="name")
    if not isinstance(name, str) or not valid_name(name):
        raise INVALID_VOICE_NAME(shown=repr(name) if isinstance(name, str) and len(name) < 80 else "the value given")
    if s.voice(name) is not None:
        raise NAME_TAKEN_BY_BUNDLED(name=name)
    upload = form.get("audio")
    if upload is None:
        raise MISSING_PARAMETER(name="audio", param="audio")
    if not isinstance(upload, UploadFile):
        raise AUDIO_NOT_A_FILE()
    transcript = form.get("transcript")
    if transcript is not None and not isinstance(transcript, str):
        raise TRANSCRIPT_NOT_TEXT()
    transcript = (transcript or "").strip() or None
    if transcript is not None and len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise TRANSCRIPT_TOO_LONG(chars=len(transcript), limit=MAX_TRANSCRIPT_CHARS)
    return name, upload, transcript


def _check_room(s: ServerState, owner: str | None) -> None:
    """Refuses a registration the quotas leave no room for (blocking: reads every record). Checked before the
    extraction and again before the write; registrations on several replicas at once may each pass it."""
    total, owned = s.voice_store.usage(owner)
    quota, cap = s.settings.max_voices_per_owner, s.settings.max_registered_voices
    if owned >= quota:
        raise OWNER_QUOTA(owned=owned, quota=quota)
    if total >= cap:
        raise STORE_FULL(total=total, cap=cap)


def _register(s: ServerState, name: str, upload: UploadFile, transcript: str | None, deadline: float, *,
              owner: str | None) -> VoiceRecord:
    """Checks the store, decodes and extracts (in a worker, by `deadline`, time.monotonic()) and stores one
    voice (in a registration thread). Any failure leaves the store as it was."""
    if s.voice_store.exists(name):
        raise NAME_TAKEN(name=name)
    _check_room(s, owner)
    upload.file.seek(0)
    data = upload.file.read()
    try:
        voice, c = s.extraction.register(data, upload.filename, upload.content_type, transcript, name, deadline)
    except (clip.ClipRejected, ClipError) as exc:
        raise Refusal(exc.code, 400, exc.message, param=exc.param) from None  # the clip's fault, in its words
    except ExtractionTimeout:
        limit = s.settings.voice_registration_timeout_s
        log.warning("voice %s: not extracted within %g s; nothing stored", name, limit)
        raise REGISTRATION_TIMEOUT(limit=limit, retry_after_s=TIMEOUT_RETRY_AFTER_S) from None
    except WorkerDied:
        raise EXTRACTION_WORKER_DIED() from None
    except PoolClosed:
        raise DRAINING_NOTHING_STORED() from None
    except ExtractionFailed as exc:
        log.error("voice %s: extraction failed: %s", name, exc)
        raise EXTRACTION_FAILED(detail=exc) from None
    rec = VoiceRecord(name=name, mode="zero_shot" if transcript else "cross_lingual", transcript=transcript,
                      created_at=int(time.time()), model=s.pipeline.manifest.name,
                      duration_seconds=round(c.seconds, 3), sample_rate=c.sample_rate, samples=c.samples,
                      format=c.format, prompt_speech_tokens=len(voice.prompt_speech_tokens),
                      sha256=hashlib.sha256(data).hexdigest(), owner=owner)
    _check_room(s, owner)  # others registered meanwhile
    try:
        s.voice_store.add(rec, voice)
    except VoiceExists:
        raise NAME_TAKEN_MEANWHILE(name=name) from None
    except OSError as exc:  # full, read-only or unmounted volume: the operator's to fix, said plainly
        log.error("voice %s: the store could not be written: %s", name, exc)
        raise STORE_WRITE_FAILED(detail=exc.strerror or exc) from None
    return rec
