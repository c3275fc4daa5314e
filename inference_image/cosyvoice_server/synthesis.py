"""The one way into a synthesis, whatever the protocol: readiness, the model, the voice, instructions and
limits checked in one place, giving a request for the scheduler or a refusal from the table
(refusals.py). The HTTP API (whole text) and the WebSocket stream (streamed text) call the same
functions and render what they return; neither re-derives a refusal.

    voice = await resolve(state, options)          # Voice | Refusal
    plan = planned(state, body.input, body.input_format, body.lexicons, body.speed)  # Plan | Refusal
    req = whole_text(state, body, voice, segments)  # SynthesisRequest | Refusal (segments: the plan's)
    req = streamed_text(state, voice, seed, instructions)  # SynthesisRequest | Refusal
"""

from __future__ import annotations

from typing import Protocol

from .engine.pipeline import Voice
from .frontend import Spoken
from .model.manifest import ModelLoadError
from .options import MAX_INPUT_CHARS, OPENAI_VOICES, SpeechRequest, VoiceRef
from .pronunciation import ssml
from .pronunciation.phones import PronunciationError
from .pronunciation.plan import Part, Pause, Plan, plain
from .refusals import (ADMISSION, CUT_OFF_BY_DRAIN, DRAINING, INPUT_TOO_LONG, INSTRUCTIONS_UNSUPPORTED, INVALID_SSML,
                       LEXICON_UNUSABLE, LOADING, NOTHING_TO_SAY, PRONUNCIATION_UNSUPPORTED, SEGMENT_TOO_LONG,
                       SSML_TEXT_TOO_LONG, STREAM_TIMED_OUT, SYNTHESIS_FAILED, TIMED_OUT, UNKNOWN_LEXICON,
                       UNKNOWN_MODEL, UNKNOWN_VOICE, VOICE_UNREADABLE, Refusal, sentence, shown)
from .scheduling.request import Outcome, SynthesisRequest
from .scheduling.scheduler import Overloaded
from .state import InstructionError, ServerState

# OpenAI's TTS model names stand for the served model
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class Options(Protocol):
    """What both protocols' options have (api/schemas.SpeechRequest, api/stream_protocol.SessionOptions)."""

    model: str | None
    voice: str | VoiceRef | None

    @property
    def voice_id(self) -> str | None: ...

    def refusal(self, sample_rate: int) -> Refusal | None:
        """What the protocol cannot do with these options (SSE without streaming, a rate a format cannot
        carry), for a model of this `sample_rate`; None when nothing."""


def ready(state: ServerState) -> Refusal | None:
    if state.draining:
        return DRAINING()
    if not state.ready:
        return LOADING()
    return None


def serves(state: ServerState, model: str) -> bool:
    return model in (state.model_id, *OPENAI_MODEL_ALIASES)


def unknown_model(state: ServerState, model: str) -> Refusal:
    return UNKNOWN_MODEL(model=model, served=state.model_id)


async def resolve(state: ServerState, options: Options) -> Voice | Refusal:
    """The voice of a synthesis with these options, once the server is ready and serves their model: bundled,
    an alias, or registered on any replica (read through the prompt cache)."""
    refused = ready(state)
    if refused is None and options.model is not None and not serves(state, options.model):
        refused = unknown_model(state, options.model)
    refused = refused or options.refusal(state.pipeline.sample_rate)
    if refused is not None:
        return refused
    name = options.voice_id
    try:
        voice = await state.find_voice(name)
    except ModelLoadError as exc:  # the store's file is damaged: the server's problem, said plainly
        return VOICE_UNREADABLE(voice=name, detail=exc)
    if voice is None:
        names = sorted([*state.pipeline.voices, *state.voice_aliases])
        registered = " or a registered voice (GET /v1/audio/voices)" if state.voice_store is not None else ""
        hint = (" OpenAI's voice names work once the model or the server maps them (voices.aliases in model.yaml, "
                "or --voice-aliases alloy=<voice>).") if name in OPENAI_VOICES else ""
        return UNKNOWN_VOICE(voice=name, available=", ".join(names) + registered, hint=hint,
                             param="voice.id" if isinstance(options.voice, VoiceRef) else "voice")
    return voice


def matcher(state: ServerState, lexicons: list[str] | None):
    """The lexicons a synthesis applies (None: the server's defaults), as a Matcher or None; or a Refusal."""
    store = state.lexicons
    try:
        return store.matcher(lexicons)
    except KeyError as exc:
        available = ", ".join(sorted(store.entries)) or "none (the server has no --lexicon-dir lexicons)"
        return UNKNOWN_LEXICON(name=shown(exc.args[0]), available=available)
    except LookupError as exc:
        return LEXICON_UNUSABLE(name=exc.args[0], detail=store.entries[exc.args[0]].error)


def planned(state: ServerState, text: str, input_format: str, lexicons: list[str] | None, speed: float
            ) -> Plan | Refusal:
    """The input as a plan of parts and pauses: SSML read, lexicons applied; or why it cannot be said."""
    found = matcher(state, lexicons)
    if isinstance(found, Refusal):
        return found
    phones = state.pipeline.frontend.phones
    try:
        if input_format != "ssml":
            return plain(text, found, phones, speed)
        plan = ssml.build(text, found, phones, speed)
    except ssml.SsmlError as exc:
        return INVALID_SSML(detail=str(exc))
    except PronunciationError as exc:
        return PRONUNCIATION_UNSUPPORTED(detail=sentence(str(exc)))
    chars = sum(len(r.text) for part in plan if isinstance(part, Part) for r in part.runs if not r.verbatim)
    if chars > MAX_INPUT_CHARS:
        return SSML_TEXT_TOO_LONG(chars=chars, limit=MAX_INPUT_CHARS)
    return plan


def whole_text(state: ServerState, body: SpeechRequest, voice: Voice, items: list[Spoken | Pause]
               ) -> SynthesisRequest | Refusal:
    """A request for the whole input (its segments and pauses from `state.text.plan`), or why it cannot be made."""
    spoken = [x for x in items if isinstance(x, Spoken)]
    segments, speeds = [x.ids for x in spoken], [x.speed for x in spoken]
    fewest, most = state.token_bounds(segments, min(speeds, default=body.speed))
    try:
        req = state.new_request(body, voice, segments, max_tokens=most, speeds=speeds)
    except InstructionError as exc:
        return INSTRUCTIONS_UNSUPPORTED(detail=sentence(str(exc)))
    if not segments:
        return NOTHING_TO_SAY()
    # marks for what the API layer places between segments (breaks) or reports (timing)
    req.segment_marks = body.timestamps == "segment" or len(spoken) < len(items)
    if fewest > most:
        rate = state.pipeline.manifest.token_rate * min(speeds)
        return INPUT_TOO_LONG(seconds=fewest / rate, limit=state.settings.max_audio_seconds)
    return req


def streamed_text(state: ServerState, voice: Voice, seed: int | None, instructions: str | None
                  ) -> SynthesisRequest | Refusal:
    """A session whose text arrives through its feed, or why it cannot be opened."""
    try:
        return state.new_bistream_request(voice, seed, instructions)
    except InstructionError as exc:
        return INSTRUCTIONS_UNSUPPORTED(detail=sentence(str(exc)))


def overloaded(exc: Overloaded) -> Refusal:
    """The scheduler's admission refusal (its bound, in its words)."""
    return ADMISSION[exc.code](reason=sentence(str(exc)), retry_after_s=exc.retry_after_s)


def ended(state: ServerState, outcome: Outcome, message: str | None, streamed_text: bool = False) -> Refusal | None:
    """How a synthesis that ended otherwise than with all its audio is reported; None for OK. (A client that
    cancelled is not told: the protocols see that before they ask.)"""
    if outcome == Outcome.OK:
        return None
    if outcome == Outcome.TIMEOUT:  # a session's deadline runs from each text's arrival: the scheduler says so
        return STREAM_TIMED_OUT(detail=sentence(message)) if streamed_text and message else \
            TIMED_OUT(limit=state.settings.request_timeout_s)
    if outcome == Outcome.SHUTDOWN:
        return CUT_OFF_BY_DRAIN(detail=message)
    if outcome == Outcome.LIMIT:
        return SEGMENT_TOO_LONG(detail=sentence(message or outcome.value))
    return SYNTHESIS_FAILED(detail=message or outcome.value)
