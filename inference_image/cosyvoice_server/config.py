"""Server settings: each one a `serve` flag and a COSYVOICE_* environment variable (the operator sets
the variables; a flag given on the command line wins)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .origins import parse_allowed_origins
from .pronunciation.lexicon import NAME as LEXICON_NAME

BUNDLED_MODELS = Path(__file__).parent / "models"  # convert/tiny.py: tiny (CosyVoice2), tiny3 (CosyVoice3)
BUNDLED_MODEL = BUNDLED_MODELS / "tiny"
# Settings with no `serve` flag: a secret belongs in the environment or a file, not in argv (`ps` shows argv).
ENV_ONLY = frozenset({"api_key", "voice_registration_key", "voice_admin_key"})


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_dir: Path = Field(BUNDLED_MODEL, description="model directory with model.yaml (default: the bundled tiny model)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="cuda fails at start-up with the reason when CUDA is unusable (never a silent CPU fallback); auto uses CUDA when it works")
    precision: Literal["auto", "fp32", "fp16", "int8"] = Field("auto", description="model files to load; auto = fp16 on CUDA when every stage has it, else fp32")
    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port for the API, probes and /metrics")
    max_batch_size: int = Field(16, ge=1, le=1024, description="most sequences per LLM step and chunks per flow/vocoder run")
    max_queue_delay_ms: float = Field(5.0, ge=0, le=10_000, description="longest a partial flow/vocoder batch waits while other requests are still upstream")
    max_queue_size: int = Field(64, ge=0, le=100_000, description="requests that may wait for an LLM slot; beyond it new requests get 429")
    request_timeout_s: float = Field(60.0, gt=0, le=3600, description="deadline per request (504 when exceeded)")
    max_audio_seconds: float = Field(600.0, gt=0, le=86_400, description="longest audio one request may produce; longer input gets 400 and generation stops there")
    stream_max_kv_mib: float = Field(64.0, gt=0, le=65_536, description="most KV cache one streamed-text session may hold for its text since the last flush; a session that needs more is ended with an error")
    header_timeout_s: float = Field(10.0, gt=0, le=3600, description="a connection that has not sent complete request headers within this is closed")
    body_timeout_s: float = Field(30.0, gt=0, le=3600, description="a request body not received completely within this gets 408")
    drain_timeout_s: float = Field(30.0, ge=0, le=3600, description="after SIGTERM, how long accepted requests may take to finish")
    max_body_bytes: int = Field(65536, ge=1024, description="largest accepted request body (413 beyond), and largest message of a WebSocket speech session")
    stream_idle_timeout_s: float = Field(20.0, gt=0, le=3600, description="a WebSocket speech session whose client sends nothing for this long while the server waits for its text is closed (error idle_timeout)")
    stream_send_buffer_bytes: int = Field(1_048_576, ge=16_384, le=1 << 30, description="encoded audio and events a WebSocket speech session may hold for a client that is not taking them (its queue, the connection's write buffer and the socket's kernel send queue together); beyond it the session is closed (error slow_consumer)")
    stream_send_timeout_s: float = Field(10.0, gt=0, le=3600, description="a WebSocket speech session whose client takes none of the audio waiting for it for this long is closed (error slow_consumer)")
    stream_max_session_s: float = Field(3600.0, gt=0, le=86_400, description="longest a WebSocket speech session may stay open, its audio included; then it is closed (error session_expired): reconnect for more")
    stream_max_sessions_per_client: int = Field(32, ge=0, le=100_000, description="WebSocket connections (sessions and those not yet past session.update) one client may hold open per replica; the client is its API key when one is in force, else its IP address as the server sees it (behind a proxy, the proxy's); more are refused in the handshake with 429 (too_many_sessions); 0: no limit")
    stream_max_pending_connections: int = Field(64, ge=1, le=100_000, description="WebSocket connections that have not sent session.update yet, all clients together; more are refused in the handshake with 429 (too_many_connections)")
    http_reserved_share: float = Field(0.25, ge=0, le=0.9, description="share of admission capacity (max_batch_size + max_queue_size, rounded down) that WebSocket sessions cannot take: kept for HTTP speech requests (sessions beyond it get session_share_full)")
    stream_reserved_share: float = Field(0.0, ge=0, le=0.9, description="share of admission capacity (rounded down) that HTTP speech requests cannot take: kept for WebSocket sessions (requests beyond it get 429 http_share_full)")
    stream_allowed_origins: str | None = Field(None, description="browser origins allowed to open WebSocket speech sessions, comma-separated (e.g. https://app.example.com,http://localhost:3000), or * for any; a handshake with any other Origin header gets 403. Clients that send no Origin (not browsers) are unaffected")
    served_model_name: str | None = Field(None, description="model id in the API (default: the manifest's name)")
    model_version: str | None = Field(None, max_length=63, description="the version name in the "
                                      "cosyvoice_model_info metric, which tells a canary's series from the stable "
                                      "version's (the operator sets the CR's modelVersion; default: the model id)")
    voice_aliases: str | None = Field(None, description="alias=voice pairs, comma-separated (e.g. alloy=default,nova=bright), "
                                      "added over the model.yaml voices.aliases table")
    api_key: str | None = Field(None, description="if set, /v1/* requires 'Authorization: Bearer <key>'", repr=False)
    api_key_file: Path | None = Field(None, description="file holding the API key (a mounted Secret); empty or unreadable stops the server at start-up; re-read within a second when it changes (a rotated Secret), keeping the last key if the new file is empty")
    voice_store_dir: Path | None = Field(None, description="directory of registered (cloned) voices, shared by every replica "
                                         "(a ReadWriteMany volume); its voices are served even with registration off")
    allow_voice_registration: bool = Field(False, description="accept POST and DELETE /v1/audio/voices (voice cloning "
                                           "from an uploaded clip); needs --voice-store-dir")
    voice_registration_key: str | None = Field(None, description="key for POST/DELETE /v1/audio/voices; the API key "
                                               "alone cannot register voices when it is set", repr=False)
    voice_registration_key_file: Path | None = Field(None, description="file holding the registration key (a mounted "
                                                     "Secret); required with registration when an API key is set; re-read when it changes, "
                                                     "as --api-key-file")
    voice_registration_owner: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$", description="owner "
                                                 "recorded on the voices this server's registration key registers, "
                                                 "and whose voices that key may delete (default: a fingerprint of "
                                                 "the key, which changes when the key is rotated); a name keeps "
                                                 "ownership across rotations: give each service sharing a voice "
                                                 "store with its own key its own name")
    voice_admin_key: str | None = Field(None, description="key that may DELETE any registered voice (those with no "
                                        "owner included) and read every transcript; it may not register voices or "
                                        "synthesize speech", repr=False)
    voice_admin_key_file: Path | None = Field(None, description="file holding the voice admin key (a mounted "
                                              "Secret); re-read when it changes, as --api-key-file")
    max_voices_per_owner: int = Field(100, ge=1, le=1_000_000, description="registered voices one owner may have "
                                      "in the store; a registration beyond it gets 409 voice_quota_exceeded")
    max_registered_voices: int = Field(1000, ge=1, le=1_000_000, description="registered voices in the store, all "
                                       "owners and unreadable records together; a registration beyond it gets 409 "
                                       "voice_store_full")
    max_voice_upload_bytes: int = Field(8 * 2**20, ge=1024, le=2**30, description="largest voice registration upload "
                                        "(413 beyond, refused before it is read whole)")
    voice_registration_concurrency: int = Field(1, ge=1, le=64, description="voice registrations extracting features at "
                                                "once, each in a worker process at a lower CPU priority; more get 429")
    voice_registration_timeout_s: float = Field(60.0, gt=0, le=3600, description="a voice registration not "
                                                "decoded and extracted within this long of its upload arriving "
                                                "(waiting for a worker included) gets 503 with Retry-After and "
                                                "nothing is stored; its worker is replaced")
    voice_worker_memory_mib: int = Field(1024, ge=64, le=65_536, description="address space (RLIMIT_AS) each "
                                         "voice extraction worker may add to what it holds once its model is "
                                         "loaded, for decoding and analysing one clip (a 30 s clip at 192 kHz "
                                         "needs under 300 MiB); a clip that needs more gets 400 audio_too_complex "
                                         "and a worker that keeps over half of it after an extraction is replaced")
    audio_encoder_threads: int = Field(4, ge=1, le=64, description="threads that encode compressed response "
                                       "audio (mp3, opus, aac, flac) off the event loop, used by nothing else: "
                                       "voice registrations and store reads cannot hold them up")
    flow_max_batch: int = Field(0, ge=0, le=1024, description="most chunks one flow run takes (at most "
                                "max_batch_size); 0: measured at start-up, the largest batch each of whose doublings "
                                "still ran more chunks per second by a margin (on CPU at CosyVoice2-0.5B's size that "
                                "is 1: batching there adds latency and no throughput)")
    vocoder_max_batch: int = Field(0, ge=0, le=1024, description="most chunks one vocoder run takes (at most "
                                   "max_batch_size); 0: measured at start-up, as flow_max_batch")
    flow_cache_mib: int = Field(2048, ge=0, le=1 << 20, description="memory for streamed segments' flow states, "
                                "all requests together: a streamed chunk computes only its new mel frames from what "
                                "the segment's earlier chunks left (about 1.1 MiB per frame of prompt and segment at "
                                "CosyVoice2-0.5B's size, i.e. 56 MiB per second, freed when the segment "
                                "ends); a segment that finds no room re-runs the flow over its prefix, with the same "
                                "audio; up to a quarter of it keeps voices' prompt states, so a voice's later "
                                "segments start after its prompt; 0 turns the cache off")
    voice_cache_bytes: int = Field(128 * 2**20, ge=0, description="memory for registered voices' prompt tensors per "
                                   "replica (least recently used evicted first; 0 reads each from the store)")
    lexicon_dir: Path | None = Field(None, description="directory of W3C PLS pronunciation lexicons (*.pls, also one "
                                     "directory down, as ConfigMap volumes mount them); each is named by its file's "
                                     "stem (GET /v1/audio/lexicons) and re-read within seconds when it changes")
    default_lexicons: str | None = Field(None, description="lexicons applied to every request that names none, "
                                         "comma-separated names from --lexicon-dir (a request's \"lexicons\": [] "
                                         "turns them off)")
    docs: bool = Field(True, description="serve /docs, /redoc and /openapi.json (behind the API key when one is set)")
    playground: bool = Field(False, description="serve the browser playground at /playground (and redirect / to it): "
                             "a page that lists the voices, speaks over HTTP and the WebSocket stream, and clones "
                             "voices, through the same API, keys and limits as any client. Its WebSocket sessions "
                             "pass the Origin policy because their Origin is the host they connect to")
    device_id: int = Field(0, ge=0, description="CUDA device ordinal (a MIG slice is always 0 inside its container)")
    gpu_mem_limit_bytes: int | None = Field(None, ge=0, description="ONNX Runtime CUDA arena limit")
    text_workers: int = Field(2, ge=1, le=64, description="processes that normalize and split request text (wetext), "
                              "outside the server process so that a long input holds up neither the event loop nor "
                              "other requests' text (a 4096-character input takes about a second of one core); each "
                              "takes about 120 MB of memory")
    intra_op_threads: int = Field(1, ge=0, description="CPU threads per ONNX Runtime session (0 = all cores; the three stages already run in parallel)")
    flow_threads: int = Field(0, ge=0, le=1024, description="CPU threads of the flow stage's sessions, the stage "
                              "that dominates at CosyVoice2-0.5B's size (0: on the CPU, every core the container may "
                              "use: its cgroup CPU limit rounded up, at most its affinity mask; on CUDA, "
                              "--intra-op-threads); sessions with more than one thread do not spin while idle, so "
                              "the other stages keep their cores")
    session_load_threads: int = Field(1, ge=1, le=3, description="threads that create the stages' ONNX Runtime "
                                      "sessions at start-up: 1, one after another; up to 3, LLM, flow and vocoder side "
                                      "by side (on 2 shared cores that did not shorten the start: docs/benchmarks.md)")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log verbosity")

    @field_validator("voice_aliases")
    @classmethod
    def _aliases_parse(cls, v: str | None) -> str | None:
        parse_voice_aliases(v)
        return v

    @field_validator("default_lexicons")
    @classmethod
    def _default_lexicons_parse(cls, v: str | None) -> str | None:
        parse_names(v)
        return v

    @field_validator("stream_allowed_origins")
    @classmethod
    def _origins_parse(cls, v: str | None) -> str | None:
        parse_allowed_origins(v)
        return v

    @model_validator(mode="after")
    def _shares_fit(self) -> Settings:
        if self.http_reserved_share + self.stream_reserved_share > 1:
            raise ValueError("http_reserved_share and stream_reserved_share together keep more than the whole "
                             "admission capacity; their sum must be at most 1")
        return self

    def allowed_origins(self) -> frozenset[str]:
        return parse_allowed_origins(self.stream_allowed_origins)

    def default_lexicon_names(self) -> list[str]:
        return parse_names(self.default_lexicons)

    def voice_alias_table(self) -> dict[str, str]:
        return parse_voice_aliases(self.voice_aliases)

    def resolved_api_key(self) -> str | None:
        """The key /v1/* requires, or None when none is configured. A key that was asked for but is blank
        or unreadable raises ConfigError: authentication fails closed, never silently off."""
        return _resolved_key(self.api_key, self.api_key_file, "api_key")

    def resolved_registration_key(self) -> str | None:
        """The key voice registration requires (None: registration is as open as the rest of /v1).

        With an API key but no registration key, enabled registration is a ConfigError: whoever may
        synthesize must not thereby be able to clone voices."""
        key = _resolved_key(self.voice_registration_key, self.voice_registration_key_file, "voice_registration_key")
        if self.allow_voice_registration:
            if self.voice_store_dir is None:
                raise ConfigError(f"voice registration needs a store: set {flag_name('voice_store_dir')} "
                                  "(a volume every replica mounts)")
            if key is None and self.resolved_api_key() is not None:
                raise ConfigError(f"voice registration with an API key needs its own key: set "
                                  f"{env_name('voice_registration_key_file')} (or {env_name('voice_registration_key')}); "
                                  "the synthesis key alone must not be able to clone voices")
        if key is not None and key == self.resolved_api_key():
            raise ConfigError("the voice registration key equals the API key; give registration a key of its own")
        return key

    def resolved_admin_key(self) -> str | None:
        """The key that may delete any registered voice (None: no caller may, unless auth is off altogether)."""
        key = _resolved_key(self.voice_admin_key, self.voice_admin_key_file, "voice_admin_key")
        if key is not None and key in (self.resolved_api_key(), self.resolved_registration_key()):
            raise ConfigError("the voice admin key equals the API key or the registration key; give it a key of its own")
        return key


def _resolved_key(value: str | None, file: Path | None, name: str) -> str | None:
    what = {"api_key": "API key", "voice_registration_key": "Voice registration key",
            "voice_admin_key": "Voice admin key"}[name]
    if value is not None:
        if not value.strip():
            raise ConfigError(f"{env_name(name)} is set but blank; refusing to start with authentication off")
        return value.strip()
    if file is None:
        return None
    if file == Path("."):
        raise ConfigError(f"{env_name(name + '_file')} is set but blank; refusing to start with authentication off")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} file {file}: cannot read it ({exc.strerror or exc}); "
                          "refusing to start without the authentication it asks for") from None
    try:
        key = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{what} file {file}: not UTF-8 text; refusing to start") from None
    if not key:
        raise ConfigError(f"{what} file {file} is empty; refusing to start with authentication off")
    return key


class ConfigError(ValueError):
    """A setting that cannot be honoured; the message is one line for the operator's logs."""


def parse_voice_aliases(spec: str | None) -> dict[str, str]:
    """`alloy=default, nova=bright` -> {"alloy": "default", "nova": "bright"}; ValueError names a bad pair."""
    pairs = [p.strip() for p in (spec or "").split(",") if p.strip()]
    bad = [p for p in pairs if p.count("=") != 1 or not all(x.strip() for x in p.split("="))]
    if bad:
        raise ValueError(f"expected alias=voice pairs separated by commas, got {bad[0]!r}")
    return {a.strip(): t.strip() for a, t in (p.split("=") for p in pairs)}


def parse_names(spec: str | None) -> list[str]:
    """`brands, places` -> ["brands", "places"]; ValueError names a bad one."""
    names = [n.strip() for n in (spec or "").split(",") if n.strip()]
    bad = [n for n in names if not re.match(LEXICON_NAME, n)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a lexicon name (lowercase letters, digits, '.', '_', '-')")
    return names


def env_name(field: str) -> str:
    return "COSYVOICE_" + field.upper()


# An empty variable normally means "unset"; for these it means a Secret resolved to nothing, which
# must stop the server rather than turn authentication off.
_FAIL_CLOSED = ("api_key", "api_key_file", "voice_registration_key", "voice_registration_key_file", "voice_admin_key",
                "voice_admin_key_file")


def from_env_and_args(args: dict[str, object]) -> Settings:
    """Flags given on the command line (non-None) override COSYVOICE_* variables, which override defaults."""
    values: dict[str, object] = {}
    for name in Settings.model_fields:
        env = os.environ.get(env_name(name))
        if env is not None and (env != "" or name in _FAIL_CLOSED):
            values[name] = env
        if args.get(name) is not None:
            values[name] = args[name]
    return Settings.model_validate(values)


def flag_name(field: str) -> str | None:
    return None if field in ENV_ONLY else "--" + field.replace("_", "-")


def _json_type(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return "string"
    kinds = {a for a in (get_args(annotation) or (annotation,)) if a is not type(None)}
    if kinds == {bool}:
        return "boolean"
    if kinds == {int}:
        return "integer"
    if kinds == {float}:
        return "number"
    return "string"  # str and Path


def settings_table() -> list[dict[str, Any]]:
    """Every setting as plain data: name, flag, env, type, default, bounds, choices, description.

    The operator ships this table (generated by ``python -m tools.sync_chart``) so that its defaults,
    the CRD's bounds and the docs are derived from the server without importing it.
    """
    rows: list[dict[str, Any]] = []
    for name, field in Settings.model_fields.items():
        default = field.default
        row: dict[str, Any] = {
            "name": name, "flag": flag_name(name), "env": env_name(name), "type": _json_type(field.annotation),
            # the bundled model's path differs per install: the description names it instead
            "default": None if isinstance(default, Path) else default,
            "nullable": type(None) in get_args(field.annotation),
            "description": field.description or "",
        }
        if get_origin(field.annotation) is Literal:
            row["choices"] = list(get_args(field.annotation))
        for bound in field.metadata:
            if isinstance(bound, Ge):
                row["minimum"] = bound.ge
            elif isinstance(bound, Gt):
                row["exclusiveMinimum"] = bound.gt
            elif isinstance(bound, Le):
                row["maximum"] = bound.le
            elif isinstance(bound, Lt):
                row["exclusiveMaximum"] = bound.lt
        rows.append(row)
    return rows
