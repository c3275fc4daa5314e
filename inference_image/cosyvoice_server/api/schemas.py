"""Request and response bodies of the OpenAI-compatible speech API."""

from __future__ import annotations

import unicodedata
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..frontend import normalize

MAX_INPUT_CHARS = 4096
# OpenAI's built-in voice names; a model maps them onto its own voices with voices.aliases (model.yaml)
# or the server's --voice-aliases.
OPENAI_VOICES = ("alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage",
                 "shimmer", "verse")


class VoiceRef(BaseModel):
    """OpenAI's voice object form, `{"id": ...}`."""

    model_config = ConfigDict(extra="ignore")
    id: str = Field(min_length=1, max_length=256, description="a voice or alias, as in GET /v1/audio/voices")


class SpeechRequest(BaseModel):
    # Unknown fields are ignored, as OpenAI's SDKs may send newer ones.
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="the served model id (GET /v1/models), or tts-1 / tts-1-hd / gpt-4o-mini-tts")
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS, description="text to speak, 1-4096 characters")
    voice: str | VoiceRef | None = Field(
        None, description="a voice or alias from GET /v1/audio/voices (OpenAI's names such as alloy resolve through "
        "the model's alias table), as a string or {\"id\": ...}; the model's default when omitted")
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = Field(
        "mp3", description="pcm is 24 kHz 16-bit little-endian mono without a header")
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream: bool = Field(True, description="extension: true sends audio as it is generated (chunked transfer, as "
                         "OpenAI does); false waits for the whole file, sent with Content-Length and X-Speech-Tokens")
    stream_format: Literal["audio", "sse"] = Field(
        "audio", description="sse: server-sent events speech.audio.delta / speech.audio.done (needs stream)")
    instructions: str | None = Field(None, max_length=MAX_INPUT_CHARS, description="how to speak, e.g. \"Speak slowly and warmly.\" (CosyVoice2 instruct2: the instruction replaces the "
                              "voice's transcript in the LLM prompt); for voices with prompt speech (cloned from a clip), "
                              "on models whose tokenizer has <|endofprompt|>")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="extension: fixes sampling, the same seed gives the same audio")

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_shape(cls, v: object) -> object:
        # one clear message instead of one error per member of the union
        if isinstance(v, dict):
            if not isinstance(v.get("id"), str) or not v["id"]:
                raise ValueError('a voice object needs a non-empty string "id", e.g. {"id": "alloy"}')
        elif v is not None and not isinstance(v, str):
            raise ValueError('voice must be a voice name or an object {"id": ...}')
        elif isinstance(v, str) and len(v) > 256:
            raise ValueError("a voice name has at most 256 characters")
        return v

    @field_validator("input")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("input must contain some text, not only whitespace")
        # The limit holds for the text at its widest: NFKC expands some characters up to 18-fold (the
        # frontend keeps full-width forms, as upstream, but a character like U+FDFA is still a whole phrase).
        if (n := len(unicodedata.normalize("NFKC", normalize(v)))) > MAX_INPUT_CHARS:
            raise ValueError(f"input is {n} characters after Unicode (NFKC) normalization; the limit is {MAX_INPUT_CHARS}")
        return v

    @property
    def voice_id(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "cosyvoice-server"


class VoiceCard(BaseModel):
    id: str
    name: str
    prompt_speech_tokens: int = Field(description="length of the voice's zero-shot prompt; 0 for an SFT speaker")
    aliases: list[str] = Field(description="other names that select this voice (e.g. OpenAI's alloy)")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    default: str = Field(description="the voice used when a request names none")
    voices: list[VoiceCard]


class ErrorDetail(BaseModel):
    message: str = Field(description="what went wrong and what to change")
    type: str = Field(description="invalid_request_error (the request must change), rate_limit_error (retry later) "
                      "or server_error")
    param: str | None = Field(description="the request field at fault, if any")
    code: str | None = Field(description="a stable machine-readable code, e.g. invalid_voice, server_overloaded")


class ErrorResponse(BaseModel):
    """Every error, in OpenAI's shape."""

    error: ErrorDetail
