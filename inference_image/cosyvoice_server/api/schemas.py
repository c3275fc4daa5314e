"""Request and response bodies of the OpenAI-compatible speech API."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# the request bodies are the options of a synthesis, defined below the API
from ..options import MAX_INPUT_CHARS, OPENAI_VOICES, SpeechRequest, VoiceRef, check_voice_shape, unicode_problem

__all__ = ["MAX_INPUT_CHARS", "OPENAI_VOICES", "SpeechRequest", "VoiceRef", "check_voice_shape", "unicode_problem",
           "ModelCard", "VoiceCard", "ModelList", "VoiceList", "LexiconCard", "LexiconList", "ErrorDetail", "ErrorResponse"]

class ModelCapabilities(BaseModel):
    """What this model and server accept, so a client can discover it instead of learning it from a 400."""

    family: str = Field(description="the upstream model family: CosyVoice2 or CosyVoice3")
    sample_rate: int = Field(description="Hz of the model's audio (`pcm` and `wav` are sent at this rate)")
    response_formats: list[str] = Field(description="values of `response_format`")
    stream_formats: list[str] = Field(description="values of `stream_format` (`audio`: chunked body, `sse`: events)")
    instructions: bool = Field(description="`instructions` are followed (the tokenizer has <|endofprompt|>); they "
                               "need a voice cloned from a clip")
    tags: list[str] = Field(description="markup the model voices when it appears in `input`, e.g. [breath], "
                            "[laughter], <strong>...</strong>")
    voice_cloning: bool = Field(description="POST /v1/audio/voices registers voices from clips on this server")
    phone_alphabets: list[str] = Field(description="pronunciation alphabets of PLS <phoneme> rules and SSML "
                                       "<phoneme> the model says (its tokenizer has their phone tokens): ipa, "
                                       "x-cmu, x-pinyin; empty: only <alias> and <sub> change how it says a word")
    input_formats: list[str] = Field(description="values of `input_format`")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "cosyvoice-server"
    capabilities: ModelCapabilities | None = Field(None, description="absent while the model is loading")


class VoiceCard(BaseModel):
    """A voice a request can name: bundled with the model, or registered from a clip (POST /v1/audio/voices)."""

    id: str = Field(description="the name to send as `voice` (or `{\"id\": ...}`)")
    object: Literal["voice"] = "voice"
    name: str
    type: Literal["bundled", "registered"] = Field(description="bundled with the model (cannot be deleted or "
                                                   "replaced) or registered through the API")
    mode: Literal["sft", "zero_shot", "cross_lingual"] = Field(
        description="zero_shot: prompted with its clip and transcript; cross_lingual: registered without a transcript "
        "(its clip's speech is not replayed into the text, so it speaks any language); sft: a trained speaker")
    prompt_speech_tokens: int = Field(description="length of the voice's prompt in speech tokens; 0 for an SFT speaker")
    aliases: list[str] = Field(default_factory=list, description="other names that select this voice (e.g. OpenAI's alloy)")
    created_at: int | None = Field(None, description="registered voices: Unix time of registration")
    transcript: str | None = Field(None, description="registered voices: the clip's transcript, null without one; "
                                   "shown to the registration and admin keys only")
    owner: str | None = Field(None, description="registered voices: the identity of the key that registered it "
                              "(never the key), null for a voice registered before owners were recorded; shown to "
                              "the registration and admin keys only")
    duration_seconds: float | None = Field(None, description="registered voices: length of the clip")
    sample_rate: int | None = Field(None, description="registered voices: the clip's sample rate")
    samples: int | None = Field(None, description="registered voices: the clip's samples (mono)")


class LexiconCard(BaseModel):
    """A W3C PLS lexicon the server holds."""

    id: str = Field(description="the name to send in `lexicons`")
    object: Literal["lexicon"] = "lexicon"
    default: bool = Field(description="applied to every request that names no lexicons")
    graphemes: int = Field(description="words and phrases it says its own way")
    alphabet: str | None = Field(description="its default phoneme alphabet, if it sets one")
    lang: str | None = Field(description="its xml:lang")
    error: str | None = Field(description="why its file cannot be read now (the last good version, if any, is in "
                              "use); null when it is fine")


class LexiconList(BaseModel):
    object: Literal["list"] = "list"
    defaults: list[str] = Field(description="the lexicons a request that names none gets")
    data: list[LexiconCard]


class SegmentTime(BaseModel):
    text: str = Field(description="what the segment says (normalized; a phoneme rule shows its word); empty for a "
                      "<break>")
    start_s: float = Field(description="where it starts in the audio, in seconds (a whole number of samples)")
    end_s: float = Field(description="where it ends; the next segment starts here")


class TimedSpeech(BaseModel):
    """A whole response with `timestamps: segment`."""

    audio: str = Field(description="the audio file in `response_format`, base64")
    format: str = Field(description="the response_format of `audio`")
    segments: list[SegmentTime] = Field(description="the audio's segments and breaks in order; they tile it")


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
