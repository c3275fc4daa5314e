"""Server settings: each one a `serve` flag and a COSYVOICE_* environment variable (the operator sets
the variables; a flag given on the command line wins)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BUNDLED_MODEL = Path(__file__).parent / "models" / "tiny"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_dir: Path = Field(BUNDLED_MODEL, description="model directory with model.yaml (default: the bundled tiny model)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="cuda fails clearly when CUDA is unusable; auto falls back to the CPU")
    precision: Literal["auto", "fp32", "fp16", "int8"] = Field("auto", description="model files to load; auto = fp16 on CUDA when present, else fp32")
    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port for the API, probes and /metrics")
    max_batch_size: int = Field(16, ge=1, le=1024, description="most sequences per LLM step and chunks per flow/vocoder run")
    max_queue_delay_ms: float = Field(5.0, ge=0, le=10_000, description="longest a partial flow/vocoder batch waits while other requests are still upstream")
    max_queue_size: int = Field(64, ge=0, le=100_000, description="requests that may wait for an LLM slot; beyond it new requests get 429")
    request_timeout_s: float = Field(60.0, gt=0, le=3600, description="deadline per request (504 when exceeded)")
    drain_timeout_s: float = Field(30.0, ge=0, le=3600, description="after SIGTERM, how long accepted requests may take to finish")
    max_body_bytes: int = Field(65536, ge=1024, description="largest accepted request body (413 beyond)")
    served_model_name: str | None = Field(None, description="model id in the API (default: the manifest's name)")
    api_key: str | None = Field(None, description="if set, /v1/* requires 'Authorization: Bearer <key>'", repr=False)
    api_key_file: Path | None = Field(None, description="file holding the API key (a mounted Secret); read at start-up")
    device_id: int = Field(0, ge=0, description="CUDA device ordinal (a MIG slice is always 0 inside its container)")
    gpu_mem_limit_bytes: int | None = Field(None, ge=0, description="ONNX Runtime CUDA arena limit")
    intra_op_threads: int = Field(1, ge=0, description="CPU threads per ONNX Runtime session (0 = all cores)")
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def resolved_api_key(self) -> str | None:
        if self.api_key:
            return self.api_key
        if self.api_key_file:
            return self.api_key_file.read_text().strip() or None
        return None


def env_name(field: str) -> str:
    return "COSYVOICE_" + field.upper()


def from_env_and_args(args: dict[str, object]) -> Settings:
    """Flags given on the command line (non-None) override COSYVOICE_* variables, which override defaults."""
    values: dict[str, object] = {}
    for name in Settings.model_fields:
        env = os.environ.get(env_name(name))
        if env not in (None, ""):
            values[name] = env
        if args.get(name) is not None:
            values[name] = args[name]
    return Settings.model_validate(values)
