"""Trace-driven simulator: the project's policy against HPA v2, KEDA, an oracle, a reactive bound and a static pool.

    cosyvoice-operator simulate --seeds 10 --out docs/autoscaling

Model (defaults in ``SimConfig``; every one is a flag of ``simulate``):

* A replica is ``slots`` concurrent requests (the server's batch) with FIFO queueing in front; a
  request's service time is lognormal (mean ``service_mean_s``, coefficient of variation
  ``service_cv``). The Service routes each request to a random **ready** replica (kube-proxy).
* A new replica costs GPU time from the moment it is created and serves after ``cold_start_s``
  (image pull, model load, warm-up). A removed replica takes no new requests and is billed until
  its accepted requests finish. Warming replicas are removed first, like a ReplicaSet does.
* Metrics pass through a Prometheus-like pipeline: samples every ``scrape_s``; ``rate()`` and
  ``histogram_quantile(0.95, ...)`` over ``rate_window_s`` with the server's own latency buckets;
  the in-flight gauge and its ``deriv()``. An autoscaler sees the latest scrape, never the truth.
* Outage windows of a trace make the service's series vanish (the query returns an empty result).

The SLO is per request (latency ≤ ``slo_ms``) and per minute (the p95 of the requests that arrived
in that minute ≤ ``slo_ms``).
"""
from __future__ import annotations

import bisect
import heapq
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .baselines import HPA, KEDA, Observation, Oracle, ProjectPolicy, ReactiveOracle, Static
from .policy import Metrics, Settings
from .simconfig import SimConfig, add_arguments

LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)
WARMUP_S = 300


# --- traces ---------------------------------------------------------------------------------------

@dataclass
class Trace:
    name: str
    rate: np.ndarray  # offered requests/s, one value per second
    arrivals: np.ndarray  # arrival times (s), sorted
    outages: list[tuple[float, float]] = field(default_factory=list)
    step_at: float | None = None  # when the step happens (recovery time is measured from it)

    @property
    def duration(self) -> int:
        return len(self.rate)


def _poisson_arrivals(rate: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    counts = rng.poisson(rate)
    secs = np.repeat(np.arange(len(rate), dtype=float), counts)
    return np.sort(secs + rng.random(len(secs)))


def _gamma_arrivals(rate: float, duration: int, cv: float, rng: np.random.Generator) -> np.ndarray:
    shape = 1.0 / cv ** 2
    n = int(rate * duration * 1.3) + 100
    gaps = rng.gamma(shape, 1.0 / (shape * rate), n)
    times = np.cumsum(gaps)
    while times[-1] < duration:
        times = np.concatenate([times, times[-1] + np.cumsum(rng.gamma(shape, 1.0 / (shape * rate), n))])
    return times[times < duration]


def make_trace(kind: str, seed: int, cfg: SimConfig, scale: float = 1.0) -> Trace:
    """``scale`` < 1 shortens every phase (tests use short traces)."""
    rng = np.random.default_rng(seed)
    b = cfg.base_rate

    def minutes(m: float) -> int:
        return max(1, int(round(m * 60 * scale)))

    if kind == "step":  # 1× → 5× held 20 min → 1×
        a, h, c = minutes(10), minutes(20), minutes(10)
        rate = np.concatenate([np.full(a, b), np.full(h, 5 * b), np.full(c, b)])
        return Trace(kind, rate, _poisson_arrivals(rate, rng), step_at=float(a))
    if kind == "diurnal":  # a compressed day: trough 0.5×, peak 3×, with slow multiplicative noise
        n = minutes(120)
        t = np.arange(n) / n
        shape = 0.5 + 2.5 * (0.5 - 0.5 * np.cos(2 * math.pi * t))
        noise = np.exp(np.convolve(rng.normal(0, 0.06, n + 299), np.ones(300) / math.sqrt(300), "valid")[:n] * 0.5)
        rate = b * shape * noise
        return Trace(kind, rate, _poisson_arrivals(rate, rng))
    if kind == "bursty":  # Gamma inter-arrivals, CV 3, mean 2×
        n = minutes(60)
        rate = np.full(n, 2 * b)
        return Trace(kind, rate, _gamma_arrivals(2 * b, n, 3.0, rng))
    if kind == "poisson":  # constant Poisson 2×: any scale event is a flap
        n = minutes(60)
        rate = np.full(n, 2 * b)
        return Trace(kind, rate, _poisson_arrivals(rate, rng))
    if kind == "outage":  # a ramp 1× → 4× over 45 min; the service's series vanish from minute 15 to 30
        n = minutes(45)
        rate = b * (1 + 3 * np.arange(n) / n)
        return Trace(kind, rate, _poisson_arrivals(rate, rng), outages=[(minutes(15), minutes(30))])
    raise ValueError(f"unknown trace {kind!r}")




# --- the cluster ----------------------------------------------------------------------------------

@dataclass
class _Replica:
    created: float
    ready_at: float
    slots: list[float]
    removed_at: float | None = None
    inflight: list[float] = field(default_factory=list)  # heap of finish times (admission control)


@dataclass
class RunResult:
    policy: str
    trace: str
    seed: int
    requests: int
    request_attainment: float
    minute_attainment: float
    violating_minutes: int
    gpu_hours: float
    scale_events_per_hour: float
    reversals_per_hour: float
    recovery_s: float | None
    rejected: int
    outage_drop: int | None  # replicas lost during the outage (0 = held)
    series: dict[str, list[float]] = field(default_factory=dict, repr=False)  # per minute, for plots


def _quantile_from_buckets(counts: np.ndarray, q: float) -> float:
    """histogram_quantile: linear interpolation inside the bucket that holds the q-th request."""
    total = counts.sum()
    if total <= 0:
        return float("nan")
    rank = q * total
    cum = np.cumsum(counts)
    i = int(np.searchsorted(cum, rank))
    if i >= len(LATENCY_BUCKETS):
        return LATENCY_BUCKETS[-1]  # the +Inf bucket: Prometheus returns the highest finite bound
    lo = LATENCY_BUCKETS[i - 1] if i > 0 else 0.0
    below = cum[i - 1] if i > 0 else 0.0
    inside = counts[i]
    return lo + (LATENCY_BUCKETS[i] - lo) * ((rank - below) / inside if inside else 0.0)


def simulate(trace: Trace, scaler: Any, cfg: SimConfig, seed: int) -> RunResult:
    rnd = random.Random(seed * 7919 + sum(map(ord, scaler.name)))
    sigma = math.sqrt(math.log(1 + cfg.service_cv ** 2))
    mu = math.log(cfg.service_mean_s) - sigma ** 2 / 2
    warm = WARMUP_S  # a warm-up at the first rate, with the initial replicas and no autoscaling
    duration = trace.duration
    total = warm + duration
    horizon = total + 4000
    cold = 0.0 if getattr(scaler, "instant", False) else cfg.cold_start_s
    nb = len(LATENCY_BUCKETS) + 1
    hist = np.zeros((horizon, nb))  # latency histogram by finish second
    done = np.zeros(horizon)  # completions by finish second
    arrived = np.zeros(horizon)
    minutes = math.ceil(duration / 60)
    m_total = np.zeros(minutes)
    m_bad = np.zeros(minutes)
    slo_s = cfg.slo_ms / 1000

    initial = min(cfg.max_replicas, max(cfg.min_replicas, math.ceil(trace.rate[0] / cfg.target_qps_per_replica)))
    if isinstance(scaler, Static):
        initial = scaler.replicas
    if isinstance(scaler, Oracle):
        scaler.offset = warm
    replicas = [_Replica(-cold, 0.0, [0.0] * cfg.slots) for _ in range(initial)]
    drain_s = 0.0
    events: list[tuple[float, int]] = []
    replica_trace: list[int] = []
    outage_counts: list[int] = []
    rng = np.random.default_rng(seed + 10_000)
    arrivals = np.concatenate([_poisson_arrivals(np.full(warm, float(trace.rate[0])), rng), trace.arrivals + warm])
    outages = [(a + warm, b + warm) for a, b in trace.outages]
    ai = 0
    next_eval = float(warm)
    admission = cfg.slots + cfg.max_queue_per_replica
    rejected = 0

    def in_outage(t: float) -> bool:
        return any(a <= t < b for a, b in outages)

    def observe(now: float) -> Observation:
        live = [r for r in replicas if r.removed_at is None]
        ready = sum(1 for r in live if r.ready_at <= now)
        last = int(now // cfg.scrape_s * cfg.scrape_s)
        if in_outage(last):
            return Observation(len(live), ready, Metrics(), empty=True)
        first = max(0, last - int(cfg.rate_window_s))
        span = max(1, last - first)
        qps = done[first + 1:last + 1].sum() / span
        short = max(0, last - 2 * int(cfg.scrape_s))
        qps_short = done[short + 1:last + 1].sum() / max(1, last - short)
        p95 = _quantile_from_buckets(hist[first + 1:last + 1].sum(axis=0), 0.95)
        # deriv(sum(rate(...[1m]))[5m:15s]): the trend of the rate over the last five minutes
        ts = [t for t in range(last, last - 300 - 1, -int(cfg.scrape_s)) if t - cfg.rate_window_s >= 0][::-1]
        rates = [done[t - int(cfg.rate_window_s) + 1:t + 1].sum() / cfg.rate_window_s for t in ts]
        slope = float(np.polyfit(ts, rates, 1)[0]) if len(ts) >= 3 else None
        samples_t = list(range(last, first - 1, -int(cfg.scrape_s)))[::-1]
        base = arrived[:first + 1].sum() - done[:first + 1].sum()
        infl = [base + arrived[first + 1:t + 1].sum() - done[first + 1:t + 1].sum() for t in samples_t]
        growth = float(np.polyfit(samples_t, infl, 1)[0]) if len(samples_t) >= 2 else 0.0
        # deriv(inflight[30s]): the gauge's change over the short window (its samples at short and last)
        infl_short = arrived[:short + 1].sum() - done[:short + 1].sum()
        growth_short = (infl[-1] - infl_short) / max(1, last - short)
        return Observation(len(live), ready, Metrics(qps=qps, inflight=infl[-1], inflight_growth=growth,
                                                     qps_short=qps_short, qps_slope=slope,
                                                     inflight_growth_short=growth_short,
                                                     p95_ms=p95 * 1000 if not math.isnan(p95) else None))

    def scale_to(now: float, desired: int) -> None:
        nonlocal drain_s
        live = [r for r in replicas if r.removed_at is None]
        if desired > len(live):
            for _ in range(desired - len(live)):
                replicas.append(_Replica(now, now + cold, [now + cold] * cfg.slots))
        elif desired < len(live):
            # warming first (newest first), then the ready replicas with the least work left
            order = sorted(live, key=lambda r: (r.ready_at <= now, max(r.slots)))
            for r in order[:len(live) - desired]:
                r.removed_at = now
                drain_s += max(0.0, max(r.slots) - now)
        if desired != len(live):
            events.append((now - warm, desired - len(live)))

    for sec in range(total):
        now = float(sec)
        if now >= next_eval:
            desired = scaler.evaluate(now, observe(now))
            scale_to(now, desired)
            next_eval += scaler.interval
        live = [r for r in replicas if r.removed_at is None]
        if sec >= warm:
            replica_trace.append(len(live))
            if in_outage(now):
                outage_counts.append(len(live))
        ready = [r for r in live if r.ready_at <= now] or sorted(live, key=lambda r: r.ready_at)[:1]
        end = bisect.bisect_left(arrivals, now + 1, lo=ai)
        m = (sec - warm) // 60
        for a in arrivals[ai:end]:
            a = float(a)
            r = ready[rnd.randrange(len(ready))] if len(ready) > 1 else ready[0]
            fl = r.inflight
            while fl and fl[0] <= a:
                heapq.heappop(fl)
            if len(fl) >= admission:  # the server's bounded admission: 429 at once
                done[sec] += 1
                arrived[sec] += 1
                if m >= 0:
                    m_total[m] += 1
                    m_bad[m] += 1
                    rejected += 1
                continue
            slots = r.slots
            i = min(range(len(slots)), key=slots.__getitem__)
            begin = slots[i] if slots[i] > a else a
            finish = begin + rnd.lognormvariate(mu, sigma)
            slots[i] = finish
            heapq.heappush(fl, finish)
            latency = finish - a
            fs = int(finish)
            if fs < horizon:
                done[fs] += 1
                hist[fs, bisect.bisect_left(LATENCY_BUCKETS, latency)] += 1
            arrived[sec] += 1
            if m >= 0:
                m_total[m] += 1
                if latency > slo_s:
                    m_bad[m] += 1
        ai = end
    gpu_s = float(sum(replica_trace)) + drain_s
    hist = hist[warm:]

    requests_n = int(m_total.sum())
    good_minutes = (m_bad <= 0.05 * m_total)
    hours = duration / 3600
    dirs = [1 if d > 0 else -1 for _, d in events]
    reversals = sum(1 for a, b in zip(dirs, dirs[1:]) if a != b)
    recovery = None
    if trace.step_at is not None:
        first = int(trace.step_at // 60)
        for m in range(first, minutes):
            if good_minutes[m:m + 5].all():
                recovery = max(0.0, m * 60 - trace.step_at)
                break
        else:
            recovery = float(duration - trace.step_at)
    drop = None
    if trace.outages:
        at_start = replica_trace[int(trace.outages[0][0])] if int(trace.outages[0][0]) < duration else 0
        drop = max(0, at_start - min(outage_counts)) if outage_counts else 0
    per_min_p95 = []
    for m in range(minutes):
        per_min_p95.append(_quantile_from_buckets(hist[m * 60:(m + 1) * 60].sum(axis=0), 0.95) * 1000)
    series = {
        "replicas": [float(np.mean(replica_trace[m * 60:(m + 1) * 60])) for m in range(minutes)],
        "p95_ms": per_min_p95,
        "rate": [float(np.mean(trace.rate[m * 60:(m + 1) * 60])) for m in range(minutes)],
    }
    return RunResult(scaler.name, trace.name, seed, requests_n,
                     float(1 - m_bad.sum() / max(1, requests_n)), float(good_minutes.mean()),
                     int((~good_minutes).sum()), gpu_s / 3600, len(events) / hours, reversals / hours,
                     recovery, rejected, drop, series)


def make_scaler(name: str, cfg: SimConfig, trace: Trace, settings: Settings | None = None) -> Any:
    if name == "policy":
        return ProjectPolicy(settings or default_settings(cfg))
    if name == "hpa":
        return HPA(cfg.target_qps_per_replica, cfg.min_replicas, cfg.max_replicas)
    if name == "keda":
        return KEDA(cfg.target_qps_per_replica, cfg.min_replicas, cfg.max_replicas)
    if name == "oracle":
        return Oracle(list(trace.rate), cfg.target_qps_per_replica, cfg.min_replicas, cfg.max_replicas)
    if name == "reactive-bound":
        return ReactiveOracle(list(trace.rate), cfg.target_qps_per_replica, cfg.min_replicas, cfg.max_replicas)
    if name == "static":
        return Static(min(cfg.max_replicas, math.ceil(float(trace.rate.max()) / cfg.target_qps_per_replica - 1e-9)))
    raise ValueError(name)


def default_settings(cfg: SimConfig) -> Settings:
    """The project's policy with the same SLO and target as the baselines, and the CRD's defaults."""
    return Settings(min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas,
                    target_qps_per_replica=cfg.target_qps_per_replica, target_p95_ms=cfg.slo_ms)


# --- experiments and report -----------------------------------------------------------------------

def run_one(args: tuple[str, str, int, SimConfig, float]) -> RunResult:
    policy, kind, seed, cfg, scale = args
    trace = make_trace(kind, seed, cfg, scale)
    return simulate(trace, make_scaler(policy, cfg, trace), cfg, seed)


def run_all(traces: Sequence[str], policies: Sequence[str], seeds: Sequence[int], cfg: SimConfig,
            scale: float = 1.0, jobs: int = 1, progress: Callable[[str], None] | None = None) -> list[RunResult]:
    work = [(p, t, s, cfg, scale) for t in traces for s in seeds for p in policies]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(run_one, work, chunksize=2))
    else:
        results = []
        for w in work:
            results.append(run_one(w))
            if progress:
                progress(f"{w[1]} seed {w[2]} {w[0]}")
    return results


def summarize(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Means over seeds per (trace, policy), with over-provisioning against the oracle of the same seed."""
    oracle = {(r.trace, r.seed): r.gpu_hours for r in results if r.policy == "oracle"}
    rows = []
    for trace in dict.fromkeys(r.trace for r in results):
        for policy in dict.fromkeys(r.policy for r in results):
            rs = [r for r in results if r.trace == trace and r.policy == policy]
            if not rs:
                continue
            over = [r.gpu_hours / oracle[(trace, r.seed)] - 1 for r in rs if (trace, r.seed) in oracle]
            rec = [r.recovery_s for r in rs if r.recovery_s is not None]
            drops = [r.outage_drop for r in rs if r.outage_drop is not None]
            rows.append({
                "trace": trace, "policy": policy, "seeds": len(rs),
                "request_attainment": float(np.mean([r.request_attainment for r in rs])),
                "minute_attainment": float(np.mean([r.minute_attainment for r in rs])),
                "violating_minutes": float(np.mean([r.violating_minutes for r in rs])),
                "gpu_hours": float(np.mean([r.gpu_hours for r in rs])),
                "over_oracle": float(np.mean(over)) if over else None,
                "recovery_s": float(np.mean(rec)) if rec else None,
                "scale_events_per_hour": float(np.mean([r.scale_events_per_hour for r in rs])),
                "reversals_per_hour": float(np.mean([r.reversals_per_hour for r in rs])),
                "outage_drop_max": int(max(drops)) if drops else None,
            })
    return rows


def verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, per trace: Pareto against HPA, attainment floors, flaps, outage."""
    out = []
    by = {(r["trace"], r["policy"]): r for r in rows}
    floors = {"diurnal": 0.99, "poisson": 0.99, "step": 0.95}
    for trace in dict.fromkeys(r["trace"] for r in rows):
        p, h = by.get((trace, "policy")), by.get((trace, "hpa"))
        if not p or not h:
            continue
        fewer_viol = p["violating_minutes"] * 2 <= h["violating_minutes"] or \
            (h["violating_minutes"] == 0 and p["violating_minutes"] == 0)
        gpu_ratio = p["gpu_hours"] / h["gpu_hours"] if h["gpu_hours"] else float("inf")
        pareto = (fewer_viol and gpu_ratio <= 1.05) or (gpu_ratio <= 0.8 and
                                                       p["minute_attainment"] >= h["minute_attainment"])
        v: dict[str, Any] = {"trace": trace, "pareto_vs_hpa": pareto, "gpu_vs_hpa": gpu_ratio,
                             "violating_minutes": (p["violating_minutes"], h["violating_minutes"])}
        if trace in floors:
            v["attainment_floor"] = floors[trace]
            v["meets_floor"] = p["minute_attainment"] >= floors[trace]
            bound = by.get((trace, "reactive-bound"))
            if bound:  # can reacting meet the floor at all (the rate known at once, the cold start paid)?
                v["reactive_bound_attainment"] = bound["minute_attainment"]
                v["floor_reachable_by_reacting"] = bound["minute_attainment"] >= floors[trace]
        if trace == "poisson":
            v["zero_reversals"] = p["reversals_per_hour"] == 0
        if trace == "outage":
            v["held_during_outage"] = p["outage_drop_max"] == 0
        out.append(v)
    return out


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "—"
    if pct:
        return f"{100 * v:.2f} %"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| trace | policy | requests ≤ SLO | minutes p95 ≤ SLO | violating min | GPU-hours | vs oracle | "
             "recovery s | scale ev/h | reversals/h | outage drop |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['trace']} | {r['policy']} | {_fmt(r['request_attainment'], True)} | "
                     f"{_fmt(r['minute_attainment'], True)} | {r['violating_minutes']:.1f} | {r['gpu_hours']:.2f} | "
                     f"{_fmt(r['over_oracle'], True) if r['over_oracle'] is not None else '—'} | "
                     f"{_fmt(r['recovery_s'])} | {r['scale_events_per_hour']:.1f} | {r['reversals_per_hour']:.1f} | "
                     f"{_fmt(r['outage_drop_max'])} |")
    return "\n".join(lines)


def plot(results: Sequence[RunResult], out: Path, cfg: SimConfig, seed: int) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    colors = {"policy": "tab:blue", "hpa": "tab:red", "keda": "tab:orange", "oracle": "tab:green",
              "static": "tab:gray", "reactive-bound": "tab:purple"}
    for trace in dict.fromkeys(r.trace for r in results):
        rs = [r for r in results if r.trace == trace and r.seed == seed]
        if not rs:
            continue
        fig, ax = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
        minutes = np.arange(len(rs[0].series["rate"]))
        ax[0].plot(minutes, rs[0].series["rate"], color="black")
        ax[0].set_ylabel("offered req/s")
        for r in rs:
            ax[1].plot(minutes, r.series["replicas"], label=r.policy, color=colors.get(r.policy))
            ax[2].plot(minutes, np.minimum(r.series["p95_ms"], 60000), label=r.policy, color=colors.get(r.policy))
        ax[1].set_ylabel("replicas (incl. warming)")
        ax[2].set_ylabel("p95 latency per minute (ms)")
        ax[2].axhline(cfg.slo_ms, linestyle="--", color="black", linewidth=0.8)
        ax[2].set_yscale("log")
        ax[2].set_xlabel("minute")
        ax[1].legend(loc="upper left", fontsize=8, ncol=5)
        ax[0].set_title(f"trace {trace}, seed {seed}")
        fig.tight_layout()
        path = out / f"autoscaling-{trace}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import time

    ap = argparse.ArgumentParser(prog="cosyvoice-operator simulate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run_cli(ap.parse_args(argv), time.perf_counter)


def run_cli(args: Any, clock: Callable[[], float]) -> int:
    cfg = SimConfig(**{k: getattr(args, k) for k in SimConfig.__dataclass_fields__})
    t0 = clock()
    results = run_all(args.traces.split(","), args.policies.split(","), list(range(args.seeds)), cfg,
                      args.scale, args.jobs)
    rows = summarize(results)
    table = markdown_table(rows)
    print(table)
    checks = verdicts(rows)
    for v in checks:
        print(json.dumps(v))
    print(f"{len(results)} runs in {clock() - t0:.0f} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(table + "\n")
        (out / "results.json").write_text(json.dumps({"config": asdict(cfg), "rows": rows, "verdicts": checks,
                                                      "runs": [replace(r, series={}).__dict__ for r in results]},
                                                     indent=1, default=str))
        plot(results, out, cfg, seed=0)
    return 0
