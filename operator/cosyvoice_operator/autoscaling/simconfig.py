"""The simulator's parameters and command-line flags (no numpy here: ``cosyvoice-operator --help`` stays fast)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ..server_settings import default as server_default
from ..spec import SCALE_TO_ZERO

POLICIES = ("policy", "hpa", "keda", "oracle", "reactive-bound", "static")
TRACES = ("step", "diurnal", "bursty", "poisson", "outage")


@dataclass(frozen=True)
class SimConfig:
    service_mean_s: float = 1.0  # one ~12 s utterance at RTF ~0.08 (CosyVoice2, L20, Triton + TRT-LLM)
    service_cv: float = 0.5
    slots: int = 4  # concurrent requests per replica at that latency (the published concurrency-4 point)
    cold_start_s: float = 120.0
    scrape_s: float = 15.0
    rate_window_s: float = 60.0
    slo_ms: float = 3000.0
    target_qps_per_replica: float = 2.5  # 62 % of a replica's 4 req/s: p95 about 2.4 s at steady load
    min_replicas: int = 1
    max_replicas: int = 40
    base_rate: float = 12.0  # requests/s at "1×"
    # the server's --max-queue-size: beyond it, 429 (a failed request)
    max_queue_per_replica: int = server_default("max_queue_size")

    def __post_init__(self) -> None:
        if self.min_replicas < 1:  # the same rule as the CRD: no wake-up path exists at zero
            raise ValueError(SCALE_TO_ZERO)


def _min_replicas(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(SCALE_TO_ZERO)
    return value


def add_arguments(ap: Any) -> None:
    d = SimConfig()
    ap.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated, from {', '.join(TRACES)}")
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {', '.join(POLICIES)}")
    ap.add_argument("--seeds", type=int, default=10, help="seeds per trace (default 10)")
    ap.add_argument("--scale", type=float, default=1.0, help="shorten every trace phase by this factor")
    ap.add_argument("--jobs", type=int, default=1, help="processes")
    ap.add_argument("--out", default=None, help="directory for results.json, results.md and PNG plots")
    for f in SimConfig.__dataclass_fields__.values():
        kind = _min_replicas if f.name == "min_replicas" else type(getattr(d, f.name))
        ap.add_argument("--" + f.name.replace("_", "-"), type=kind, default=getattr(d, f.name))


