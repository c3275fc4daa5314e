"""Every refusal the server gives, as data: one table that the HTTP API and the WebSocket speech stream
both render, so that the same condition gets the same code and the same words whatever the transport.

A `Reason` is a row: the error `code`, the HTTP `status`, the WebSocket `close_code` (RFC 6455), OpenAI's
error `type`, a message template and the option it is about (`param`). Calling a row with the template's
fields gives a `Refusal`, an exception that api/errors.py renders as `{"error": {...}}` with its status,
and api/speech_stream.py as an `error` event and a close frame (or, in the handshake, as the HTTP answer).

    raise DRAINING()
    raise UNKNOWN_MODEL(model="tts-2", served="cosyvoice2-0.5b")
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

# WebSocket close codes (RFC 6455 section 7.4.1, IANA registry)
NORMAL = 1000
GOING_AWAY = 1001  # the server is draining (shutting down): reconnect to another replica
UNSUPPORTED_DATA = 1003  # a binary frame from the client
POLICY_VIOLATION = 1008  # the client broke the protocol (bad event, idle, not reading)
MESSAGE_TOO_BIG = 1009
INTERNAL_ERROR = 1011
TRY_AGAIN_LATER = 1013  # admission full or the model still loading

INVALID_REQUEST, RATE_LIMIT, PERMISSION, SERVER = ("invalid_request_error", "rate_limit_error", "permission_error",
                                                   "server_error")
MAX_SHOWN_CHARS = 100  # a value quoted back in a message (an origin, a name) is cut to this many characters


@dataclass(eq=False)  # an exception: compared and hashed by identity
class Refusal(Exception):
    """One refusal, ready to render: what the client is told and how each transport says it."""

    code: str
    status: int
    message: str
    type: str = INVALID_REQUEST
    param: str | None = None
    close_code: int = POLICY_VIOLATION
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    def __str__(self) -> str:
        return self.message

    def error(self) -> dict:
        """OpenAI's error object."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


@dataclass(frozen=True)
class Reason:
    """A row of the table. `param`: the option the refusal is about (a caller may name a deeper one, such
    as `voice.id`); `retry_after_s`: the Retry-After a client should honour (a caller may pass its own)."""

    code: str
    status: int
    template: str
    type: str = INVALID_REQUEST
    close_code: int = POLICY_VIOLATION
    param: str | None = None
    retry_after_s: int | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def fields(self) -> set[str]:
        return {name for _, name, _, _ in string.Formatter().parse(self.template) if name}

    def __call__(self, *, param: str | None = None, retry_after_s: int | None = None, **fields: object) -> Refusal:
        headers = dict(self.headers)
        retry = self.retry_after_s if retry_after_s is None else retry_after_s
        if retry is not None:
            headers["Retry-After"] = str(retry)
        return Refusal(self.code, self.status, self.template.format(**fields), self.type, param or self.param,
                       self.close_code, headers)


def shown(value: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """A client's value quoted in a message, cut to `limit` characters."""
    return value if len(value) <= limit else value[:limit] + "..."


def sentence(message: str) -> str:
    """A lower-case clause from below (the scheduler, the engine) as a sentence of a message."""
    return message[:1].upper() + message[1:].rstrip(".") + "."


# --- the server's state ------------------------------------------------------------------------------
DRAINING = Reason("shutting_down", 503, "The server is shutting down; retry on another replica.", SERVER, GOING_AWAY,
                  retry_after_s=1)
LOADING = Reason("model_loading", 503, "The model is still loading; retry shortly.", SERVER, TRY_AGAIN_LATER,
                 retry_after_s=5)
TEXT_WORKER_DIED = Reason("text_worker_unavailable", 503, "The text normalization process stopped (see the server "
                          "log); it has been restarted: retry.", SERVER, INTERNAL_ERROR, retry_after_s=1)
INTERNAL = Reason("internal_error", 500, "Internal server error ({exception}); see the server log.", SERVER,
                  INTERNAL_ERROR)

# --- who may connect ---------------------------------------------------------------------------------
BAD_KEY = Reason("invalid_api_key", 401, "Missing or incorrect API key: send {how}.",
                 headers=(("WWW-Authenticate", "Bearer"),))
ORIGIN_NOT_ALLOWED = Reason("origin_not_allowed", 403, "Web pages from the origin {origin!r} may not open speech "
                            "sessions on this server: its operator lists the origins allowed "
                            "(--stream-allowed-origins).")
TOO_MANY_SESSIONS = Reason("too_many_sessions", 429, "This client already holds {held} speech connections, the most "
                           "one client may ({cap}); end one before opening another.", RATE_LIMIT, TRY_AGAIN_LATER)
TOO_MANY_CONNECTIONS = Reason("too_many_connections", 429, "{pending} connections are waiting to send "
                              "session.update, the most the server takes; retry shortly, and send session.update "
                              "as soon as the socket is open.", RATE_LIMIT, TRY_AGAIN_LATER, retry_after_s=1)

# --- admission (the scheduler's `refusal` says which bound, Overloaded's message says it in words) ---------
ADMISSION = {code: Reason(code, 429, "{reason}", RATE_LIMIT, TRY_AGAIN_LATER)
             for code in ("server_overloaded", "session_share_full", "http_share_full")}

# --- the options of a synthesis ----------------------------------------------------------------------
UNKNOWN_MODEL = Reason("model_not_found", 404, "The model '{model}' does not exist; this server serves '{served}'.",
                       param="model")
UNKNOWN_VOICE = Reason("invalid_voice", 400, "Unknown voice '{voice}'; available: {available}.{hint}", param="voice")
VOICE_UNREADABLE = Reason("voice_unreadable", 500, "The registered voice '{voice}' cannot be read from the voice "
                          "store ({detail}); delete and register it again.", SERVER, INTERNAL_ERROR)
INSTRUCTIONS_UNSUPPORTED = Reason("unsupported_parameter", 400, "{detail}", param="instructions")
SPEED_WITH_STREAMED_TEXT = Reason("unsupported_parameter", 400, "speed is not available with streamed text: it "
                                  "stretches a whole segment once it is complete (as upstream CosyVoice2 applies "
                                  "it), which would hold back all audio until each flush. Leave it at 1.0.",
                                  param="speed")
SAMPLE_RATE_UNAVAILABLE = Reason("invalid_value", 400, "sample_rate {rate} is not available for {format}; choose one "
                                 "of {allowed}.", param="sample_rate")
SSE_NEEDS_STREAM = Reason("invalid_value", 400, "stream_format 'sse' sends events as they are generated; it cannot be "
                          "combined with stream=false.", param="stream_format")
NOTHING_TO_SAY = Reason("invalid_value", 400, "The input has no speakable text after normalization.", param="input")
INPUT_TOO_LONG = Reason("input_too_long", 400, "The input would make at least {seconds:.1f} s of audio; the limit is "
                        "{limit:g} s per request. Split the text into several requests.", param="input")

TIMESTAMPS_NEED_EVENTS = Reason("invalid_value", 400, "timestamps 'segment' needs somewhere to put the times: "
                                "stream_format 'sse' (speech.segment events) or stream=false (a JSON body with "
                                "the audio and its segments); a raw audio stream cannot carry them.",
                                param="timestamps")
INVALID_SSML = Reason("invalid_ssml", 400, "The input is not SSML this server speaks: {detail}.", param="input")
SSML_TEXT_TOO_LONG = Reason("input_too_long", 400, "The SSML document's text is {chars} characters; the limit is "
                            "{limit}.", param="input")
UNKNOWN_LEXICON = Reason("lexicon_not_found", 400, "Unknown lexicon '{name}'; this server holds: {available}.",
                         param="lexicons")
LEXICON_UNUSABLE = Reason("lexicon_unavailable", 503, "The lexicon '{name}' cannot be read on this server "
                          "({detail}); its operator must fix it.", SERVER, INTERNAL_ERROR, param="lexicons")
PRONUNCIATION_UNSUPPORTED = Reason("unsupported_pronunciation", 400, "{detail}", param="lexicons")
PROSODY_WITH_STREAMED_TEXT = ("is not available with streamed text: speed stretches a whole segment once it is "
                              "complete, which would hold back the audio until each flush; use POST "
                              "/v1/audio/speech")

# --- how a synthesis ended, when not with all its audio --------------------------------------------------
TIMED_OUT = Reason("timeout", 504, "Synthesis did not finish within the request timeout of {limit:g} s.", SERVER,
                   INTERNAL_ERROR)
STREAM_TIMED_OUT = Reason("timeout", 504, "{detail}", SERVER, INTERNAL_ERROR)  # the session's own clock says which
CUT_OFF_BY_DRAIN = Reason("shutting_down", 503, "The server shut down before synthesis finished: {detail}. Retry on "
                          "another replica.", SERVER, GOING_AWAY, retry_after_s=1)
SYNTHESIS_FAILED = Reason("internal_error", 500, "Synthesis failed: {detail}.", SERVER, INTERNAL_ERROR)
SEGMENT_TOO_LONG = Reason("segment_too_long", 400, "{detail}", param="type")

# --- the HTTP request itself ----------------------------------------------------------------------------
BODY_TIMEOUT = Reason("request_timeout", 408, "The request body did not arrive within {limit:g} s.",
                      headers=(("Connection", "close"),))
BODY_COMPRESSED = Reason("unsupported_media_type", 415, "Content-Encoding {encoding!r} is not supported: send the "
                         "JSON body uncompressed.")
BODY_DECLARED_TOO_LARGE = Reason("request_too_large", 413, "Request body is {declared} bytes; the limit is {limit}.")
BODY_TOO_LARGE = Reason("request_too_large", 413, "Request body exceeds the limit of {limit} bytes.")
NOT_JSON = Reason("invalid_json", 400, "The request body is not valid JSON.")
JSON_TOO_DEEP = Reason("invalid_json", 400, "The request body nests JSON too deeply.")
NOT_AN_OBJECT = Reason("invalid_json", 400, "The request body must be a JSON object.")
MISSING_PARAMETER = Reason("missing_required_parameter", 400, "Missing required parameter: '{name}'.")
FORM_NOT_MULTIPART = Reason("unsupported_media_type", 415, "Send the voice as multipart/form-data with fields name, "
                            "audio (a file) and optionally transcript.")
FORM_UNPARSABLE = Reason("invalid_multipart", 400, "The multipart body could not be parsed: {detail}.")
UPLOAD_TOO_LARGE = Reason("request_too_large", 413, "The upload{size} is over the limit of {limit} bytes for a voice "
                          "clip; a few seconds of mono speech need far less (e.g. 10 s of 16-bit 48 kHz WAV is under "
                          "1 MB).", param="audio")
INVALID_VOICE_NAME = Reason("invalid_voice_name", 400, "Invalid voice name {shown}: use 1-63 lowercase letters, "
                            "digits, '.', '_' or '-', starting with a letter or digit.", param="name")
AUDIO_NOT_A_FILE = Reason("invalid_value", 400, "'audio' must be a file upload (multipart file part), not a text "
                          "field.", param="audio")
TRANSCRIPT_NOT_TEXT = Reason("invalid_value", 400, "'transcript' must be a text field.", param="transcript")
TRANSCRIPT_TOO_LONG = Reason("invalid_value", 400, "The transcript has {chars} characters; the limit is {limit}.",
                             param="transcript")

# --- registered voices -----------------------------------------------------------------------------------
VOICE_NOT_FOUND = Reason("voice_not_found", 404, "No voice named '{name}' (GET /v1/audio/voices lists them).",
                         param="name")
VOICE_RECORD_UNREADABLE = Reason("voice_unreadable", 500, "The voice '{name}' is in the voice store but its record "
                                 "cannot be read ({detail}); it is left out of the listing until an operator "
                                 "repairs it or the admin key deletes it.", SERVER, INTERNAL_ERROR, param="name")
NOT_VOICE_OWNER = Reason("not_voice_owner", 403, "The voice '{name}' is not this key's to delete: {why}. Only the key "
                         "that registered a voice, or the voice admin key, may delete it.", PERMISSION, param="name")
REGISTRATION_OFF = Reason("voice_registration_disabled", 403, "Voice registration is off on this server (start it "
                          "with --allow-voice-registration).", PERMISSION)
INSUFFICIENT_SCOPE = Reason("insufficient_scope", 403, "{detail}", PERMISSION)
BUNDLED_VOICE = Reason("bundled_voice", 409, "'{name}' is bundled with the model; only registered voices can be "
                       "deleted.", param="name")
NAME_TAKEN_BY_BUNDLED = Reason("voice_exists", 409, "'{name}' is a bundled voice or alias; registered voices cannot "
                               "replace it.", param="name")
NAME_TAKEN = Reason("voice_exists", 409, "A voice named '{name}' is already registered; delete it first or pick "
                    "another name.", param="name")
NAME_TAKEN_MEANWHILE = Reason("voice_exists", 409, "A voice named '{name}' was registered meanwhile (on this or "
                              "another replica).", param="name")
OWNER_QUOTA = Reason("voice_quota_exceeded", 409, "This key has registered {owned} voices, the most one owner may "
                     "have ({quota}); delete one of them first.")
STORE_FULL = Reason("voice_store_full", 409, "The voice store holds {total} voices, the most this server allows "
                    "({cap}); delete one first, or ask the operator to raise max_registered_voices.")
REGISTRATION_BUSY = Reason("registration_busy", 429, "{busy} voice registration(s) are already extracting features on "
                           "this replica; retry shortly.", RATE_LIMIT, TRY_AGAIN_LATER, retry_after_s=1)
REGISTRATION_TIMEOUT = Reason("registration_timeout", 503, "The voice could not be extracted within {limit:g} s: the "
                              "server's CPU is busy with synthesis, which comes first. Nothing was stored; retry "
                              "later.", SERVER, TRY_AGAIN_LATER)
EXTRACTION_WORKER_DIED = Reason("registration_unavailable", 503, "The voice feature extraction process stopped (see "
                                "the server log); a fresh one is starting: retry.", SERVER, TRY_AGAIN_LATER,
                                retry_after_s=1)
DRAINING_NOTHING_STORED = Reason("shutting_down", 503, "The server is shutting down; nothing was stored. Retry on "
                                 "another replica.", SERVER, GOING_AWAY, retry_after_s=1)
EXTRACTION_FAILED = Reason("extraction_failed", 500, "The voice could not be extracted ({detail}); nothing was "
                           "stored.", SERVER, INTERNAL_ERROR)
STORE_WRITE_FAILED = Reason("voice_store_error", 500, "The voice store could not be written ({detail}); nothing was "
                            "stored.", SERVER, INTERNAL_ERROR)


def table() -> dict[str, Reason]:
    """Every row by its name in this module (docs and tests read it)."""
    rows = {name: value for name, value in globals().items() if isinstance(value, Reason)}
    return rows | {f"ADMISSION[{code}]": reason for code, reason in ADMISSION.items()}
