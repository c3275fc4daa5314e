"""The WebSocket speech-stream protocol (GET /v1/audio/speech/stream): its events, parsed and checked
without any I/O. docs/streaming.md is the user's description; this module is the one definition.

Names follow what voice-agent developers already use: OpenAI Realtime's dotted `object.verb` event
types (`session.update`, `session.created`, `error` with OpenAI's error object), OpenAI's speech
events (`speech.audio.delta`, `speech.audio.done`, as this server's SSE stream), and the hosted
input-streaming TTS APIs' append / flush / end of input (Deepgram `Speak`/`Flush`, ElevenLabs
`flush`, Cartesia `continue: false`).

Every protocol violation ends the session: an `error` event, then a close frame whose code says what
kind of failure it was (RFC 6455 codes), so a client can tell "fix the request" from "retry later".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..options import MAX_LEXICONS, VoiceRef, check_lexicon_names, check_voice_shape, unicode_problem
from ..refusals import (GOING_AWAY, INTERNAL_ERROR, INVALID_REQUEST, MESSAGE_TOO_BIG, NORMAL,  # noqa: F401 (the
                        POLICY_VIOLATION, SAMPLE_RATE_UNAVAILABLE, SPEED_WITH_STREAMED_TEXT, TRY_AGAIN_LATER,
                        UNSUPPORTED_DATA, Refusal)  # protocol's)
from .errors import validation_message

# Formats whose streams can be played as they arrive; the sample rates each can carry.
STREAM_FORMATS = ("pcm", "wav", "opus", "mp3")
PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
FORMAT_RATES = {"pcm": PCM_RATES, "wav": PCM_RATES, "opus": (8000, 12000, 16000, 24000, 48000),
                "mp3": (8000, 16000, 22050, 24000, 44100, 48000)}
MAX_EVENT_ID = 64
FIELDS = {"session.update": ("session",), "input_text.append": ("text",)}  # beside type and event_id


class SessionOptions(BaseModel):
    """`session.update`'s `session`: fixed for the whole session."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, min_length=1, description="the served model id, or tts-1 / tts-1-hd / "
                              "gpt-4o-mini-tts; the served model when omitted")
    voice: str | VoiceRef | None = Field(None, description="a voice or alias (GET /v1/audio/voices), as a string "
                                         "or {\"id\": ...}; the model's default when omitted")
    response_format: Literal["pcm", "wav", "opus", "mp3"] = Field(
        "pcm", description="pcm: 16-bit little-endian mono without a header; wav: that behind a streaming RIFF "
        "header; opus: Ogg Opus; mp3")
    sample_rate: int | None = Field(None, description="output sample rate in Hz; the model's (24000) when omitted")
    stream_format: Literal["audio", "json"] = Field(
        "audio", description="audio: binary WebSocket frames; json: speech.audio.delta events with base64 audio")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="fixes sampling: the same seed and text give "
                             "the same audio")
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = Field(None, max_length=4096)
    input_format: Literal["text", "ssml"] = Field(
        "text", description="ssml: the session's text is one SSML document, sent in pieces (<break> is silence in "
        "place, <s>/<p> end segments; <prosody rate> is not available with streamed text)")
    lexicons: list[str] | None = Field(None, max_length=MAX_LEXICONS, description="pronunciation lexicons by name "
                                       "(GET /v1/audio/lexicons); omitted: the server's defaults; []: none")

    @field_validator("lexicons")
    @classmethod
    def _lexicon_names(cls, v: list[str] | None) -> list[str] | None:
        return check_lexicon_names(v)

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_shape(cls, v: object) -> object:
        return check_voice_shape(v)

    @property
    def voice_id(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def rate(self, model_rate: int) -> int:
        """The output rate: the one asked for, else the model's (0 is a mistake, not the default)."""
        return model_rate if self.sample_rate is None else self.sample_rate

    def refusal(self, model_rate: int) -> Refusal | None:
        """Streamed text takes no `speed` (upstream stretches whole segments, which would hold back all audio
        until each flush), and each format carries only some rates."""
        if self.speed != 1.0:
            return SPEED_WITH_STREAMED_TEXT()
        rate, allowed = self.rate(model_rate), FORMAT_RATES[self.response_format]
        if rate not in allowed:
            return SAMPLE_RATE_UNAVAILABLE(rate=rate, format=self.response_format, allowed=", ".join(map(str, allowed)))
        return None


@dataclass(frozen=True)
class SessionUpdate:
    options: SessionOptions
    event_id: str | None = None


@dataclass(frozen=True)
class Append:
    text: str
    event_id: str | None = None


@dataclass(frozen=True)
class Flush:
    event_id: str | None = None


@dataclass(frozen=True)
class End:
    event_id: str | None = None


ClientEvent = SessionUpdate | Append | Flush | End
CLIENT_EVENTS = {"session.update": SessionUpdate, "input_text.append": Append, "input_text.flush": Flush,
                 "input_text.end": End}


class ProtocolError(Refusal):
    """A refusal within a session: sent as an `error` event (OpenAI's error object and the client event it
    answers), then the session closes with `close_code`."""

    def __init__(self, code: str, message: str, *, param: str | None = None, close_code: int = POLICY_VIOLATION,
                 type: str = INVALID_REQUEST, event_id: str | None = None) -> None:
        super().__init__(code, 400, message, type, param, close_code)
        self.event_id = event_id

    @classmethod
    def of(cls, refusal: Refusal, event_id: str | None = None, options: bool = True) -> ProtocolError:
        """A refusal from the table, said in the session; `options`: its param names a session option."""
        param = f"session.{refusal.param}" if options and refusal.param else refusal.param
        return cls(refusal.code, refusal.message, param=param, close_code=refusal.close_code, type=refusal.type,
                   event_id=event_id)

    def event(self) -> dict:
        """OpenAI Realtime's error event."""
        return {"type": "error", "error": self.error() | {"event_id": self.event_id}}


def parse_event(text: str, max_bytes: int) -> ClientEvent:
    """One client text frame as an event; ProtocolError says what is wrong with it."""
    if len(text.encode()) > max_bytes:
        raise ProtocolError("message_too_large", f"A message is {len(text.encode())} bytes; the limit is {max_bytes}. "
                            "Send long text as several input_text.append events.", close_code=MESSAGE_TOO_BIG)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ProtocolError("invalid_json", "A message is not valid JSON; every client message is a JSON object "
                            "with a \"type\".") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_json", "A message must be a JSON object with a \"type\".")
    event_id = data.get("event_id")
    if event_id is not None and (not isinstance(event_id, str) or len(event_id) > MAX_EVENT_ID):
        raise ProtocolError("invalid_value", f"event_id must be a string of at most {MAX_EVENT_ID} characters.",
                            param="event_id")
    kind = data.get("type")
    if kind not in CLIENT_EVENTS:
        shown = f"'{kind}'" if isinstance(kind, str) and len(kind) <= 64 else "missing or not a string"
        raise ProtocolError("unknown_event", f"Unknown event type ({shown}); the client events are "
                            f"{', '.join(CLIENT_EVENTS)}.", param="type", event_id=event_id)
    extra = sorted(set(data) - {"type", "event_id", *FIELDS.get(kind, ())})
    if extra:
        raise ProtocolError("unknown_parameter", f"Unrecognized argument '{extra[0]}' in {kind}.", param=extra[0],
                            event_id=event_id)
    if kind == "session.update":
        raw = data.get("session", {})
        if not isinstance(raw, dict):
            raise ProtocolError("invalid_value", "session must be an object of session options.", param="session",
                                event_id=event_id)
        try:
            return SessionUpdate(SessionOptions.model_validate(raw), event_id)
        except ValidationError as exc:
            msg, param, code = validation_message(exc.errors())
            raise ProtocolError(code, msg, param=f"session.{param}" if param else "session", event_id=event_id) from None
    if kind == "input_text.append":
        text_ = data.get("text")
        if not isinstance(text_, str):
            raise ProtocolError("invalid_value", "input_text.append needs a string \"text\".", param="text",
                                event_id=event_id)
        if problem := unicode_problem(text_):
            raise ProtocolError("invalid_value", f"The text must be Unicode text; {problem}.", param="text",
                                event_id=event_id)
        return Append(text_, event_id)
    return CLIENT_EVENTS[kind](event_id=event_id)


class SessionRules:
    """What may come when: session.update first and once, text until input_text.end, nothing after it."""

    def __init__(self) -> None:
        self.started = False
        self.ended = False

    def check(self, event: ClientEvent) -> None:
        eid = event.event_id
        if isinstance(event, SessionUpdate):
            if self.started:
                raise ProtocolError("session_already_started", "The session options are fixed once set: send "
                                    "session.update only as the first message; open a new session for other "
                                    "options.", param="type", event_id=eid)
            self.started = True
            return
        if not self.started:
            raise ProtocolError("session_not_started", "The first message must be session.update with the session "
                                "options.", param="type", event_id=eid)
        if self.ended:
            raise ProtocolError("input_ended", "No more input after input_text.end: the session is finishing its "
                                "audio.", param="type", event_id=eid)
        if isinstance(event, End):
            self.ended = True


def segment_times(text: str, start: int, end: int, rate: int) -> dict:
    """A segment's text and place in the session's audio (samples at the model's rate), for speech.segment.done."""
    return {"text": text, "start_s": start / rate, "end_s": end / rate}


def usage(characters: int, audio_seconds: float, input_tokens: int | None = None,
          output_tokens: int | None = None) -> dict:
    """The usage object of speech.segment.done and speech.audio.done."""
    out: dict = {"input_characters": characters, "audio_seconds": round(audio_seconds, 3)}
    if input_tokens is not None and output_tokens is not None:
        out |= {"input_tokens": input_tokens, "output_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens}
    return out
