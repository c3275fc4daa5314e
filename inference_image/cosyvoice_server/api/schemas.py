"""Request and response bodies of the OpenAI-compatible speech API."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_INPUT_CHARS = 4096


class SpeechRequest(BaseModel):
    # Unknown fields are ignored, as OpenAI's SDKs may send newer ones.
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="the served model id (GET /v1/models), or tts-1 / tts-1-hd / gpt-4o-mini-tts")
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS, description="text to speak, 1-4096 characters")
    voice: str | None = Field(None, description="a voice from GET /v1/audio/voices; the model's default when omitted")
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = Field(
        "mp3", description="pcm is 24 kHz 16-bit little-endian mono without a header")
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream: bool = Field(False, description="send audio chunks as they are generated (chunked transfer)")
    stream_format: Literal["audio", "sse"] = Field(
        "audio", description="sse: server-sent events speech.audio.delta / speech.audio.done (implies stream)")
    instructions: str | None = Field(None, max_length=MAX_INPUT_CHARS, description="not supported by CosyVoice2 SFT/zero-shot voices")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="extension: fixes sampling, the same seed gives the same audio")

    @field_validator("input")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("input must contain some text, not only whitespace")
        return v

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format == "sse"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "cosyvoice-server"


class VoiceCard(BaseModel):
    id: str
    name: str
    prompt_speech_tokens: int = Field(description="length of the voice's zero-shot prompt; 0 for an SFT speaker")
