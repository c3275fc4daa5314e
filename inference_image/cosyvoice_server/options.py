"""What a client asks a synthesis for, below every protocol: the OpenAI speech body (`SpeechRequest`), which
the HTTP API takes as it is and the server's warm-up builds, and the voice forms both protocols accept."""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from .frontend import normalize
from .pronunciation.lexicon import NAME as LEXICON_NAME
from .pronunciation.ssml import MAX_SSML_CHARS
from .refusals import SSE_NEEDS_STREAM, TIMESTAMPS_NEED_EVENTS, Refusal

MAX_INPUT_CHARS = 4096
MAX_LEXICONS = 16  # named in one request
# OpenAI's built-in voice names; a model maps them onto its own voices with voices.aliases (model.yaml)
# or the server's --voice-aliases.
OPENAI_VOICES = ("alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage",
                 "shimmer", "verse")

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def unicode_problem(text: str) -> str | None:
    """Why `text` is no Unicode text, or None. JSON's \\ud800 escapes decode to lone surrogates, which no
    tokenizer or encoder takes (pydantic's plain str fields refuse them; members of a union do not)."""
    if _SURROGATE.search(text):
        return "it holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not a Unicode character"
    return None


def check_voice_shape(v: object) -> object:
    """The `voice` field's one clear message, instead of one error per member of its union."""
    if isinstance(v, dict):
        if not isinstance(v.get("id"), str) or not v["id"]:
            raise ValueError('a voice object needs a non-empty string "id", e.g. {"id": "alloy"}')
        name = v["id"]
    elif v is None or isinstance(v, str):
        name = v
    else:
        raise ValueError('voice must be a voice name or an object {"id": ...}')
    if name is not None and (problem := unicode_problem(name)):
        raise ValueError(f"a voice name must be Unicode text; {problem}")
    return v


class VoiceRef(BaseModel):
    """OpenAI's voice object form, `{"id": ...}`."""

    model_config = ConfigDict(extra="ignore")
    id: str = Field(min_length=1, max_length=256, description="a voice or alias, as in GET /v1/audio/voices")


def check_lexicon_names(v: list[str] | None) -> list[str] | None:
    """Names as the server lists them (GET /v1/audio/lexicons), each once."""
    for name in v or ():
        if not re.match(LEXICON_NAME, name):
            raise ValueError(f"'{name[:64]}' is not a lexicon name (lowercase letters, digits, '.', '_', '-')")
    if v is not None and len(set(v)) != len(v):
        raise ValueError("a lexicon is named twice")
    return v


class SpeechRequest(BaseModel):
    # Unknown fields are ignored, as OpenAI's SDKs may send newer ones.
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="the served model id (GET /v1/models), or tts-1 / tts-1-hd / gpt-4o-mini-tts")
    input_format: Literal["text", "ssml"] = Field(
        "text", description="extension: text (default), or ssml: `input` is an SSML document (<speak> with <break>, "
        "<sub>, <phoneme>, <say-as>, <prosody rate>, <p>, <s>, <lang>) of at most 32768 characters")
    input: str = Field(min_length=1, max_length=MAX_SSML_CHARS, description="text to speak, 1-4096 characters (an "
                       "SSML document: up to 32768, its text up to 4096)")
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
    lexicons: list[str] | None = Field(None, max_length=MAX_LEXICONS, description="extension: the pronunciation "
                                       "lexicons to apply, by name (GET /v1/audio/lexicons), earlier ones first; "
                                       "omitted: the server's default lexicons; []: none")
    timestamps: Literal["none", "segment"] = Field(
        "none", description="extension: segment reports each segment's text, start_s and end_s: as speech.segment "
        "events with stream_format sse, or with stream false as JSON {\"audio\": base64, \"segments\": [...]}")
    @field_validator("voice", mode="before")
    @classmethod
    def _voice_shape(cls, v: object) -> object:
        if isinstance(v, str) and len(v) > 256:
            raise ValueError("a voice name has at most 256 characters")
        return check_voice_shape(v)

    @field_validator("lexicons")
    @classmethod
    def _lexicon_names(cls, v: list[str] | None) -> list[str] | None:
        return check_lexicon_names(v)

    @field_validator("input")
    @classmethod
    def _not_blank(cls, v: str, info: ValidationInfo) -> str:
        if not v.strip():
            raise ValueError("input must contain some text, not only whitespace")
        if info.data.get("input_format") == "ssml":  # its text is checked once the document is read
            return v
        if len(v) > MAX_INPUT_CHARS:
            raise ValueError(f"input is {len(v)} characters; the limit is {MAX_INPUT_CHARS} (an SSML document, "
                             "input_format ssml, may be longer)")
        # The limit holds for the text at its widest: NFKC expands some characters up to 18-fold (the
        # frontend keeps full-width forms, as upstream, but a character like U+FDFA is still a whole phrase).
        if (n := len(unicodedata.normalize("NFKC", normalize(v)))) > MAX_INPUT_CHARS:
            raise ValueError(f"input is {n} characters after Unicode (NFKC) normalization; the limit is {MAX_INPUT_CHARS}")
        return v

    @property
    def voice_id(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def refusal(self, sample_rate: int) -> Refusal | None:
        """SSE sends events as audio is generated: it needs `stream`; segment times need a place to go (SSE
        events, or the JSON of a whole response)."""
        if not self.stream and self.stream_format == "sse":
            return SSE_NEEDS_STREAM()
        if self.timestamps == "segment" and self.stream and self.stream_format != "sse":
            return TIMESTAMPS_NEED_EVENTS()
        return None
