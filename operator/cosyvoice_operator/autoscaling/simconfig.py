"""The simulator's parameters and command-line flags (no numpy here: ``cosyvoice-operator --help`` stays fast)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from ..spec import SCALE_TO_ZERO, Batching

POLICIES = ("policy", "hpa", "hpa-arrival", "keda", "static", "oracle", "reactive-bound")
EXTRA_POLICIES = ("sessions",)  # on request only (docs/streaming.md): not in the default comparison
FAMILIES = ("step", "ramp", "periodic", "bursty", "poisson", "outage", "mixed")  # traces.FAMILIES, without numpy


def _deployed() -> Batching:
    """The batch and queue settings the operator deploys when a CR sets none: the replica being simulated."""
    return Batching()


MAX_TRACE_S = 31 * 86400  # the longest trace replayed: a month, longer than any forecast lookback

# The least value of each numeric parameter, and whether it is excluded (a zero SLO, scrape or batch has no meaning)
BOUNDS: dict[str, tuple[float, bool]] = {
    "audio_s": (0, True), "max_batch_size": (1, False), "max_queue_size": (0, False), "cold_start_s": (0, False),
    "scrape_s": (0, True), "rate_window_s": (0, True), "slo_ms": (0, True), "target_qps_per_replica": (0, False),
    "max_replicas": (1, False), "minutes": (0, True),
}


def _param(default: Any = None, help: str = "", factory: Any = None) -> Any:
    """A parameter with its flag's help text (the flags are made from these fields)."""
    meta = {"help": help}
    return field(default_factory=factory, metadata=meta) if factory else field(default=default, metadata=meta)


@dataclass(frozen=True)
class SimConfig:
    profile: str = _param("tiny-cpu", "capacity profile of one replica: a bundled name or a JSON file written by "
                                      "bench/capacity.py")
    audio_s: float = _param(12.0, "mean seconds of audio per request (one or two sentences) of generated traces and "
                                  "of trace files without a third column")
    max_batch_size: int = _param(help="the replica's batch size; the default is what the operator deploys",
                                 factory=lambda: _deployed().max_batch_size)
    max_queue_size: int = _param(help="the replica's queue before it answers 429; the default is what the operator "
                                      "deploys", factory=lambda: _deployed().max_queue_size)
    cold_start_s: float | None = _param(None, "seconds from a pod's creation to its first answer (image pull, model "
                                               "load, warm-up) for every start; default: the profile's measured "
                                               "start, a cache miss on a node new to the model and a hit on one "
                                               "that ran a replica before")
    scrape_s: float = _param(15.0, "Prometheus scrape interval, seconds")
    rate_window_s: float = _param(60.0, "window of the baselines' rate() queries, seconds")
    slo_ms: float = _param(2000.0, "objective, ms: p95 of response time per minute")
    target_qps_per_replica: float = _param(0.0, "the baselines' requests/s per pod; 0: the profile's rate at the SLO")
    min_replicas: int = _param(1, "replica floor of every autoscaler")
    max_replicas: int = _param(40, "replica ceiling of every autoscaler")
    minutes: float = _param(60.0, "scored minutes of a generated trace, after its history lead")

    def __post_init__(self) -> None:
        if self.min_replicas < 1:  # the same rule as the CRD: no wake-up path exists at zero
            raise ValueError(SCALE_TO_ZERO)
        for name, (least, strict) in BOUNDS.items():
            value = getattr(self, name)
            if value is None:  # taken from the profile
                continue
            if value < least or (strict and value == least):
                flag, relation = name.replace("_", "-"), ">" if strict else "≥"
                raise ValueError(f"--{flag} must be {relation} {least:g} (got {value:g})")
        if self.minutes * 60 > MAX_TRACE_S:
            raise ValueError(f"--minutes must be ≤ {MAX_TRACE_S // 60} (got {self.minutes:g})")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"--max-replicas ({self.max_replicas}) is below --min-replicas ({self.min_replicas})")
        if self.rate_window_s < 2 * self.scrape_s:  # rate() needs two samples in its window, as in Prometheus
            raise ValueError(f"--rate-window-s ({self.rate_window_s:g}) must span two scrapes (--scrape-s "
                             f"{self.scrape_s:g})")


def _min_replicas(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(SCALE_TO_ZERO)
    return value


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1 (got {value})")
    return value


def _frontier_points(text: str) -> int:
    value = int(text)
    if value != 0 and value < 2:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or ≥ 2 targets (got {value})")
    return value


def add_arguments(ap: Any) -> None:
    d = SimConfig()
    src = ap.add_argument_group("traffic (one of)")
    src.add_argument("--traces", default=",".join(FAMILIES), help=f"generated families: {', '.join(FAMILIES)}")
    src.add_argument("--trace-file", metavar="CSV",
                     help="replay t_seconds,rate_rps[,mean_audio_s] rows (the time in seconds, or an ISO 8601 date "
                          "as Grafana exports it)")
    src.add_argument("--from-prometheus", metavar="URL",
                     help="export --query over --range from Prometheus as a trace, then replay it")
    ap.add_argument("--set", choices=("tuning", "heldout"), default="heldout",
                    help="parameter ranges and seeds of generated traces (default heldout)")
    ap.add_argument("--seeds", type=_at_least_one, default=10,
                    help="generated traces per family, from the set's 10 (default 10); with a trace file, "
                         "replays of it with other random arrivals")
    ap.add_argument("--outage", action="append", default=[], metavar="START:END",
                    help="seconds of the trace during which the service's metrics vanish (repeatable)")
    ap.add_argument("--history", metavar="DURATION",
                    help="the trace's first DURATION (e.g. 1d) is history: replayed for every autoscaler and in "
                         "the forecast's lookback, as Prometheus holds it for a running service, but not scored")
    ap.add_argument("--query", default="sum(rate(cosyvoice_requests_total[1m]))",
                    help="with --from-prometheus: requests/s of the service")
    ap.add_argument("--audio-query", default=None,
                    help="with --from-prometheus: mean audio seconds per request (optional third column)")
    ap.add_argument("--range", default="7d", help="with --from-prometheus: how far back (e.g. 12h, 7d)")
    ap.add_argument("--step", default="60s", help="with --from-prometheus: sample spacing")
    ap.add_argument("--save-trace", metavar="CSV", help="with --from-prometheus: where to write the trace")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help=f"comma-separated, from {', '.join(POLICIES + EXTRA_POLICIES)}; static+K (static-K): "
                         "a fixed pool K replicas above (below) the one sized for the peak")
    ap.add_argument("--service", metavar="YAML",
                    help="simulate the policy of this CosyVoiceService manifest (its spec.autoscaling, enabled or "
                         "not yet; - reads it from standard input, e.g. from kubectl get cvs NAME -o yaml): its "
                         "SLO, replica bounds, cold start, batching and capacity profile replace the flags' values")
    ap.add_argument("--frontier", type=_frontier_points, default=0, metavar="N",
                    help="also run HPA and KEDA at N per-pod targets from 0.5x to 1.5x of theirs (e.g. 11) and "
                         "report where the policy lies against each family's frontier of GPU-hours and violating "
                         "minutes (default 0: off)")
    ap.add_argument("--jobs", type=_at_least_one, default=1, help="processes")
    ap.add_argument("--json", action="store_true", help="print the summary rows and verdicts as JSON")
    ap.add_argument("--out", default=None, help="directory for results.json, results.md and PNG plots")
    for f in SimConfig.__dataclass_fields__.values():
        kind = _min_replicas if f.name == "min_replicas" else float if f.name == "cold_start_s" else \
            type(getattr(d, f.name))
        ap.add_argument("--" + f.name.replace("_", "-"), type=kind, default=getattr(d, f.name),
                        help=f.metadata["help"] + ("" if getattr(d, f.name) is None else " (default %(default)s)"))
