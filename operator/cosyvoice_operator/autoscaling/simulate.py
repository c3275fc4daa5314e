"""Trace-driven simulator: the project's policy against HPA v2, KEDA, a static pool and an oracle.

    cosyvoice-operator simulate --set heldout --seeds 10 --jobs 2 --out docs/autoscaling
    cosyvoice-operator simulate --trace-file last-week.csv --outage 3600:4500 --json

Model (defaults in ``SimConfig``; every one is a flag of ``simulate``):

* A replica is the server the operator deploys: ``max_batch_size`` requests in service at once and
  ``max_queue_size`` waiting (beyond: 429), the defaults of the CRD's ``spec.batching``. A request's
  service time is what the capacity profile (``profile.py``, measured by ``bench.capacity``) gives
  for its length with that many requests in service, lognormally spread as measured. The Service
  routes each request to a random **ready** replica (kube-proxy).
* A new replica costs GPU time from the moment it is created and serves after its cold start, the
  capacity profile's measured one (``profile.ColdStart``; ``cold_start_s`` sets one for every start):
  one replica per node, nodes kept for the whole trace, the model cached on every node that ran a
  replica; so a replica beyond the most that were live at once before lands on a node new to the model
  and pays a cache miss, any other a hit. A removed replica takes no new requests and is billed until
  its accepted requests finish. Warming replicas are removed first, like a ReplicaSet does.
* Metrics pass through a Prometheus-like pipeline: samples every ``scrape_s``; ``rate()`` and
  ``histogram_quantile(0.95, ...)`` over ``rate_window_s`` with the server's latency buckets; the
  in-flight gauge and its ``deriv()``; the audio seconds per request; the rate's history for the
  policy's forecast. An autoscaler sees the latest scrape, never the truth.
* Outage windows make the service's series vanish (the query returns an empty result).

The SLO is per request (latency ≤ ``slo_ms``) and per minute (the p95 of the requests that arrived
in that minute ≤ ``slo_ms``). A trace's ``lead_s`` of history is simulated for every autoscaler and
scored for none.
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

from .. import server_settings
from . import frontier
from . import profile as profiles
from . import traces
from .baselines import HPA, KEDA, Observation, Oracle, ProjectPolicy, ReactiveOracle, Static
from .policy import Metrics, Settings
from .simconfig import EXTRA_POLICIES, MAX_TRACE_S, POLICIES, SimConfig, add_arguments
from .traces import Trace

LATENCY_BUCKETS = server_settings.latency_buckets()  # the server's (cosyvoice_server/metrics.py)
WARMUP_S = 300  # at the trace's first rate with the initial replicas, before the trace starts
LENGTH_CV = 0.3  # spread of request lengths around a second's mean (sentences vary)


def load_profile(cfg: SimConfig) -> profiles.Profile:
    return profiles.load(cfg.profile, batching=cfg)


def cold_start(cfg: SimConfig, prof: profiles.Profile) -> profiles.ColdStart:
    """A replica's start: the profile's measured hit and miss, or ``--cold-start-s`` for every start."""
    if cfg.cold_start_s is None:
        return prof.cold_start
    return profiles.ColdStart(cfg.cold_start_s, cfg.cold_start_s, "--cold-start-s")


def baseline_target(cfg: SimConfig, prof: profiles.Profile) -> float:
    """The per-pod QPS target the baselines are given: the rate one replica takes within the objective at
    the typical request length, with the policy's sizing margin (the same knowledge, a fixed number)."""
    if cfg.target_qps_per_replica:
        return cfg.target_qps_per_replica
    return prof.rate_at_slo(cfg.slo_ms / 1000 * Settings().sizing_latency_ratio, cfg.audio_s)


def needed_replicas(rate: np.ndarray, audio: np.ndarray, cfg: SimConfig, prof: profiles.Profile) -> np.ndarray:
    """Replicas each second's load needs to meet the SLO (what the oracle and the static pool know)."""
    caps = {a: max(prof.rate_at_slo(cfg.slo_ms / 1000, a), 1e-3) for a in np.unique(np.round(audio, 1))}
    return np.array([r / caps[a] for r, a in zip(rate, np.round(audio, 1))])


def _arrivals(rate: np.ndarray, cv: float, rng: np.random.Generator) -> np.ndarray:
    if cv == 1.0:
        counts = rng.poisson(rate)
        secs = np.repeat(np.arange(len(rate), dtype=float), counts)
        return np.sort(secs + rng.random(len(secs)))
    # a renewal process with Gamma inter-arrival times at the (constant) mean rate: bursts, same mean
    mean = float(np.mean(rate))
    shape = 1.0 / cv ** 2
    n = int(mean * len(rate) * 1.3) + 100
    times = np.cumsum(rng.gamma(shape, 1.0 / (shape * mean), n))
    while times[-1] < len(rate):
        times = np.concatenate([times, times[-1] + np.cumsum(rng.gamma(shape, 1.0 / (shape * mean), n))])
    return times[times < len(rate)]


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
    rejected: int
    outage_drop: int | None  # replicas lost during the outage (0 = held)
    params: dict[str, Any] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict, repr=False)  # per minute, for plots
    starts: int = 0  # replicas created during the scored minutes
    cache_misses: int = 0  # of which on a node new to the model


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


def simulate(trace: Trace, scaler: Any, cfg: SimConfig, seed: int, prof: profiles.Profile | None = None) -> RunResult:
    prof = prof or load_profile(cfg)
    rnd = random.Random(seed * 7919 + sum(map(ord, scaler.name)))
    warm = WARMUP_S
    start = warm + trace.lead_s  # the first scored second
    total = warm + trace.duration
    scored = trace.duration - trace.lead_s
    horizon = total + 4000
    start_s = profiles.ColdStart(0.0, 0.0, "instant") if getattr(scaler, "instant", False) else cold_start(cfg, prof)
    nb = len(LATENCY_BUCKETS) + 1
    hist = np.zeros((horizon, nb))  # latency histogram by finish second
    done = np.zeros(horizon)  # completions by finish second
    audio_done = np.zeros(horizon)  # seconds of audio of the successful completions
    ok_done = np.zeros(horizon)
    arrived = np.zeros(horizon)
    minutes = math.ceil(scored / 60)
    m_total = np.zeros(minutes)
    m_bad = np.zeros(minutes)
    slo_s = cfg.slo_ms / 1000
    bsize, admission = prof.max_batch_size, prof.max_batch_size + prof.max_queue_size
    sigma = prof.sigma
    mu = -sigma * sigma / 2
    latency_of: dict[tuple[int, float], float] = {}

    rate = np.concatenate([np.full(warm, float(trace.rate[0])), trace.rate])
    audio = np.concatenate([np.full(warm, float(trace.audio_s[0])), trace.audio_s])
    initial = min(cfg.max_replicas, max(cfg.min_replicas, math.ceil(
        float(needed_replicas(rate[:1], audio[:1], cfg, prof)[0]) - 1e-9)))
    if isinstance(scaler, Static):
        initial = scaler.replicas
    if isinstance(scaler, Oracle):
        scaler.offset = warm
    replicas = [_Replica(-start_s.miss_s, 0.0, [0.0] * bsize) for _ in range(initial)]
    nodes = initial  # nodes whose cache holds the model: the most replicas live at once so far
    starts = misses = 0
    drain_s = 0.0
    events: list[tuple[float, int]] = []
    replica_trace: list[int] = []
    outage_counts: list[int] = []
    rng = np.random.default_rng(seed + 10_000)
    arrivals = _arrivals(rate, trace.burst_cv, rng)
    sizes = audio[arrivals.astype(int)] * rng.lognormal(-LENGTH_CV ** 2 / 2, LENGTH_CV, len(arrivals))
    outages = [(a + warm, b + warm) for a, b in trace.outages]
    ai = 0
    next_eval = float(warm)
    rejected = 0
    lookback = getattr(scaler, "lookback_s", 0.0)
    window = int(cfg.rate_window_s)

    longest = float(sizes.max()) if len(sizes) else 0.0

    def open_sessions(t: float) -> float:
        """Streaming sessions open at ``t``, each request standing for a voice agent's session that stays
        open while its audio plays (real time): Little's law with the audio's length, whatever the load."""
        lo, hi = bisect.bisect_left(arrivals, t - longest), bisect.bisect_right(arrivals, t)
        return float(np.count_nonzero(arrivals[lo:hi] + sizes[lo:hi] > t))

    def in_outage(t: float) -> bool:
        return any(a <= t < b for a, b in outages)

    def observe(now: float) -> Observation:
        live = [r for r in replicas if r.removed_at is None]
        ready = sum(1 for r in live if r.ready_at <= now)
        last = int(now // cfg.scrape_s * cfg.scrape_s)
        if in_outage(last):
            return Observation(len(live), ready, Metrics(), empty=True)
        # a scrape at `last` counts the seconds before it: completions are booked ahead (at their finish
        # second), arrivals as they come, so second `last` itself would count the one and not the other
        first = max(0, last - window)
        span = max(1, last - first)
        qps = done[first:last].sum() / span
        short = max(0, last - 2 * int(cfg.scrape_s))
        qps_short = done[short:last].sum() / max(1, last - short)
        p95 = _quantile_from_buckets(hist[first:last].sum(axis=0), 0.95)
        ok = ok_done[first:last].sum()
        audio_s = audio_done[first:last].sum() / ok if ok else None
        # deriv(sum(rate(...[1m]))[5m:15s]): the trend of the rate over the last five minutes
        ts = [t for t in range(last, last - 300 - 1, -int(cfg.scrape_s)) if t - window >= 0][::-1]
        rates = [done[t - window:t].sum() / window for t in ts]
        slope = float(np.polyfit(ts, rates, 1)[0]) if len(ts) >= 3 else None
        samples_t = list(range(last, first - 1, -int(cfg.scrape_s)))[::-1]
        base = arrived[:first].sum() - done[:first].sum()
        infl = [base + arrived[first:t].sum() - done[first:t].sum() for t in samples_t]
        growth = float(np.polyfit(samples_t, infl, 1)[0]) if len(samples_t) >= 2 else 0.0
        # deriv(inflight[30s]): the gauge's change over the short window (its samples at short and last)
        infl_short = arrived[:short].sum() - done[:short].sum()
        growth_short = (infl[-1] - infl_short) / max(1, last - short)
        history: tuple[float, ...] = ()
        work: tuple[float, ...] = ()
        shorts: tuple[float, ...] = ()
        step = 60.0
        if lookback > 0:
            # the 1-minute rates, one sample a minute (coarser for long lookbacks), as a range query returns them
            step = max(60.0, math.ceil(lookback / 240 / 60) * 60)
            ends = np.arange(last, max(window, last - int(lookback)) - 1, -int(step))[::-1]
            cum = np.concatenate([[0.0], np.cumsum(done[:last])])
            history = tuple(float(x) for x in (cum[ends] - cum[ends - window]) / window)
            short_w = 2 * int(cfg.scrape_s)  # the burst window, as qps_short
            shorts = tuple(float(x) for x in (cum[ends] - cum[ends - short_w]) / short_w)
            cum = np.concatenate([[0.0], np.cumsum(audio_done[:last])])
            work = tuple(float(x) for x in (cum[ends] - cum[ends - window]) / window)
        return Observation(len(live), ready, Metrics(qps=qps, inflight=infl[-1], inflight_growth=growth,
                                                     qps_short=qps_short, qps_slope=slope,
                                                     inflight_growth_short=growth_short, audio_s=audio_s,
                                                     sessions=open_sessions(last),
                                                     rate_history=history, work_history=work, short_history=shorts,
                                                     history_step_s=step,
                                                     p95_ms=p95 * 1000 if not math.isnan(p95) else None))

    def scale_to(now: float, desired: int) -> None:
        nonlocal drain_s, nodes, starts, misses
        live = [r for r in replicas if r.removed_at is None]
        if desired > len(live):
            for n in range(len(live) + 1, desired + 1):
                miss = n > nodes
                ready_at = now + (start_s.miss_s if miss else start_s.hit_s)
                replicas.append(_Replica(now, ready_at, [ready_at] * bsize))
                if now >= start:
                    starts, misses = starts + 1, misses + miss
            nodes = max(nodes, desired)
        elif desired < len(live):
            # warming first (newest first), then the ready replicas with the least work left
            order = sorted(live, key=lambda r: (r.ready_at <= now, max(r.slots)))
            for r in order[:len(live) - desired]:
                r.removed_at = now
                if now >= start:
                    drain_s += max(0.0, max(r.slots) - now)
        if desired != len(live) and now >= start:
            events.append((now - start, desired - len(live)))

    for sec in range(total):
        now = float(sec)
        if now >= next_eval:
            desired = scaler.evaluate(now, observe(now))
            scale_to(now, desired)
            next_eval += scaler.interval
        live = [r for r in replicas if r.removed_at is None]
        if sec >= start:
            replica_trace.append(len(live))
            if in_outage(now):
                outage_counts.append(len(live))
        ready = [r for r in live if r.ready_at <= now] or sorted(live, key=lambda r: r.ready_at)[:1]
        end = bisect.bisect_left(arrivals, now + 1, lo=ai)
        m = (sec - start) // 60
        for j in range(ai, end):
            a = float(arrivals[j])
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
            i = min(range(bsize), key=slots.__getitem__)
            begin = slots[i] if slots[i] > a else a
            busy = 1 + sum(1 for f in slots if f > begin)  # in service once it starts, itself included
            size = float(sizes[j])
            key = (min(busy, bsize), round(size, 1))
            mean = latency_of.get(key)
            if mean is None:
                mean = latency_of[key] = prof.mean_latency_s(key[0], key[1])
            finish = begin + mean * rnd.lognormvariate(mu, sigma)
            slots[i] = finish
            heapq.heappush(fl, finish)
            latency = finish - a
            fs = int(finish)
            if fs < horizon:
                done[fs] += 1
                ok_done[fs] += 1
                audio_done[fs] += size
                hist[fs, bisect.bisect_left(LATENCY_BUCKETS, latency)] += 1
            arrived[sec] += 1
            if m >= 0:
                m_total[m] += 1
                if latency > slo_s:
                    m_bad[m] += 1
        ai = end
    gpu_s = float(sum(replica_trace)) + drain_s
    hist = hist[start:]

    requests_n = int(m_total.sum())
    good_minutes = (m_bad <= 0.05 * m_total)
    hours = scored / 3600
    dirs = [1 if d > 0 else -1 for _, d in events]
    reversals = sum(1 for a, b in zip(dirs, dirs[1:]) if a != b)
    drop = None
    if trace.outages:
        first_out = int(trace.outages[0][0]) - trace.lead_s
        at_start = replica_trace[first_out] if 0 <= first_out < len(replica_trace) else 0
        drop = max(0, at_start - min(outage_counts)) if outage_counts else 0
    per_min_p95 = [_quantile_from_buckets(hist[m * 60:(m + 1) * 60].sum(axis=0), 0.95) * 1000 for m in range(minutes)]
    lead = warm + trace.lead_s
    series = {
        "replicas": [float(np.mean(replica_trace[m * 60:(m + 1) * 60])) for m in range(minutes)],
        "p95_ms": per_min_p95,
        "rate": [float(np.mean(rate[lead + m * 60:lead + (m + 1) * 60])) for m in range(minutes)],
        "needed": [float(np.mean(needed_replicas(rate[lead + m * 60:lead + (m + 1) * 60],
                                                 audio[lead + m * 60:lead + (m + 1) * 60], cfg, prof)))
                   for m in range(minutes)],
    }
    return RunResult(scaler.name, trace.name, seed, requests_n,
                     float(1 - m_bad.sum() / max(1, requests_n)), float(good_minutes.mean()),
                     int((~good_minutes).sum()), gpu_s / 3600, len(events) / hours, reversals / hours,
                     rejected, drop, dict(trace.params), series, starts, misses)


def make_scaler(name: str, cfg: SimConfig, trace: Trace, prof: profiles.Profile | None = None,
                settings: Settings | None = None) -> Any:
    prof = prof or load_profile(cfg)
    target = baseline_target(cfg, prof)
    if name == "policy":
        return ProjectPolicy(settings or default_settings(cfg, prof))
    if name == "hpa":
        return HPA(target, cfg.min_replicas, cfg.max_replicas)
    if name == "hpa-arrival":
        return HPA(target, cfg.min_replicas, cfg.max_replicas, arrival=True, name="hpa-arrival")
    if name == "keda":
        return KEDA(target, cfg.min_replicas, cfg.max_replicas, arrival=True)
    swept = frontier.scaled(name)
    if swept is not None:  # hpa@0.7: the baseline at 0.7× its target, for the frontier
        scaler = make_scaler(swept[0], cfg, trace, prof, settings)
        return replace(scaler, target_qps_per_replica=target * swept[1], name=name)
    need = needed_replicas(trace.rate, trace.audio_s, cfg, prof)
    if name == "oracle":
        return Oracle(list(need), cfg.min_replicas, cfg.max_replicas)
    if name == "reactive-bound":
        return ReactiveOracle(list(need), cfg.min_replicas, cfg.max_replicas)
    if name == "sessions":  # the project's policy on open sessions alone (targetSessionsPerReplica)
        scaler = ProjectPolicy(sessions_settings(cfg, prof))
        scaler.name = "sessions"
        return scaler
    if name == "static" or _pool_offset(name) is not None:
        # static+K: K replicas more (static-K: fewer) than the pool sized for the peak, for the pool sweep
        peak = math.ceil(float(need.max()) - 1e-9) + (_pool_offset(name) or 0)
        return Static(min(cfg.max_replicas, max(cfg.min_replicas, peak)), name=name)
    raise ValueError(f"unknown policy {name!r}")


def _pool_offset(name: str) -> int | None:
    """K of ``static+K`` / ``static-K`` (None: not such a name)."""
    head, sign, k = name.partition("+") if "+" in name else name.partition("-")
    return int(sign + k) if head == "static" and sign and k.isdigit() else None


def valid_policy(name: str) -> bool:
    return name in POLICIES + EXTRA_POLICIES or _pool_offset(name) is not None or frontier.scaled(name) is not None


def sessions_settings(cfg: SimConfig, prof: profiles.Profile) -> Settings:
    """targetSessionsPerReplica from the measured replica: real-time sessions it carries within the objective
    (the audio seconds per second it produces at the rate the profile allows, with the sizing margin)."""
    rate = prof.rate_at_slo(cfg.slo_ms / 1000 * Settings().sizing_latency_ratio, cfg.audio_s)
    return Settings(min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas,
                    cold_start_s=cold_start(cfg, prof).miss_s, target_sessions_per_replica=rate * cfg.audio_s)


def default_settings(cfg: SimConfig, prof: profiles.Profile) -> Settings:
    """The project's policy with the simulator's SLO and profile, and the CRD's defaults for the rest."""
    return Settings(min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas, target_p95_ms=cfg.slo_ms,
                    profile=prof, cold_start_s=cfg.cold_start_s)


# --- experiments and report -----------------------------------------------------------------------

Work = tuple[str, Trace, int, SimConfig, Settings | None]


def run_one(work: Work) -> RunResult:
    policy, trace, seed, cfg, settings = work
    prof = load_profile(cfg)
    return simulate(trace, make_scaler(policy, cfg, trace, prof, settings), cfg, seed, prof)


def service_config(text: str, cfg: SimConfig) -> tuple[SimConfig, Settings, str]:
    """The policy of the one CosyVoiceService in ``text``, as the operator would build it once
    ``spec.autoscaling.enabled`` is true, and the simulator's parameters that the manifest decides (the
    replica it deploys, the SLO it scores). Also a line saying what was taken from it."""
    import yaml

    from ..manifest import services
    from ..spec import InvalidSpec, parse_spec

    try:
        found = services(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"--service: not YAML: {exc}") from None
    except InvalidSpec as exc:
        raise ValueError(f"--service: {exc}") from None
    if len(found) > 1:
        raise ValueError(f"--service: the file holds {len(found)} CosyVoiceServices "
                         f"({', '.join(s.name for s in found)}); simulate them one file at a time")
    svc = found[0]
    if not svc.raw.get("autoscaling"):
        raise ValueError(f"--service: CosyVoiceService {svc.name} has no spec.autoscaling to simulate")
    try:  # validated as enabled: what it needs to run (maxReplicas, a target) is required then
        spec = parse_spec({**svc.raw, "autoscaling": {**svc.raw["autoscaling"], "enabled": True}})
    except InvalidSpec as exc:
        raise ValueError(f"--service: CosyVoiceService {svc.name}, with autoscaling enabled: {exc}") from None
    auto = spec.autoscaling
    assert auto is not None and auto.max_replicas is not None  # required when enabled
    cfg = replace(cfg, profile=auto.capacity_profile or cfg.profile, min_replicas=auto.min_replicas,
                  max_replicas=auto.max_replicas,
                  cold_start_s=None if auto.cold_start_seconds is None else float(auto.cold_start_seconds),
                  slo_ms=float(auto.target_p95_latency_ms or cfg.slo_ms),
                  target_qps_per_replica=auto.target_qps_per_replica or cfg.target_qps_per_replica,
                  max_batch_size=spec.batching.max_batch_size, max_queue_size=spec.batching.max_queue_size)
    prof = profiles.load(auto.capacity_profile, batching=spec.batching) if auto.capacity_profile else None
    settings = Settings.from_spec(auto, prof)
    start = cold_start(cfg, load_profile(cfg))
    cold = f"cold start {start.miss_s:g} s" + \
        (f" ({start.hit_s:g} s with the model cached on the node)" if start.hit_s != start.miss_s else "") + \
        (f", forecast {settings.start_s:g} s ahead" if settings.start_s != start.miss_s else "")
    taken = (f"CosyVoiceService {svc.name}: replicas {cfg.min_replicas}–{cfg.max_replicas}, SLO p95 "
             f"{cfg.slo_ms:g} ms{'' if auto.target_p95_latency_ms else ' (--slo-ms: it sets no targetP95LatencyMs)'}, "
             f"{cold}, batch {cfg.max_batch_size}, queue {cfg.max_queue_size}, "
             f"replica profile {cfg.profile}")
    return cfg, settings, taken


def generated(families: Sequence[str], set_name: str, seeds: int, cfg: SimConfig) -> list[tuple[Trace, int]]:
    prof = load_profile(cfg)
    unit = prof.rate_at_slo(cfg.slo_ms / 1000, cfg.audio_s)
    ts = traces.SETS[set_name]
    return [(traces.generate(f, s, ts, unit, cfg.audio_s, cfg.minutes), s) for f in families for s in ts.seeds[:seeds]]


def run_all(work_traces: Sequence[tuple[Trace, int]], policies: Sequence[str], cfg: SimConfig, jobs: int = 1,
            progress: Callable[[str], None] | None = None, settings: Settings | None = None) -> list[RunResult]:
    """Every policy on every trace; ``settings``: the project's policy as configured (default: the CRD's
    defaults with the simulator's SLO and profile)."""
    work = [(p, t, s, cfg, settings) for t, s in work_traces for p in policies]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs) as pool:
            return list(pool.map(run_one, work, chunksize=1))
    results = []
    for w in work:
        results.append(run_one(w))
        if progress:
            progress(f"{w[1].name} seed {w[2]} {w[0]}")
    return results


def summarize(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Means over seeds per (trace, policy), with GPU-hours over the oracle's of the same trace."""
    oracle = {(r.trace, r.seed): r.gpu_hours for r in results if r.policy == "oracle"}
    rows = []
    for trace in dict.fromkeys(r.trace for r in results):
        for policy in dict.fromkeys(r.policy for r in results):
            rs = [r for r in results if r.trace == trace and r.policy == policy]
            if not rs:
                continue
            over = [r.gpu_hours / oracle[(trace, r.seed)] - 1 for r in rs if (trace, r.seed) in oracle]
            drops = [r.outage_drop for r in rs if r.outage_drop is not None]
            rows.append({
                "trace": trace, "policy": policy, "seeds": len(rs),
                "request_attainment": float(np.mean([r.request_attainment for r in rs])),
                "minute_attainment": float(np.mean([r.minute_attainment for r in rs])),
                "min_minute_attainment": float(np.min([r.minute_attainment for r in rs])),
                "violating_minutes": float(np.mean([r.violating_minutes for r in rs])),
                "gpu_hours": float(np.mean([r.gpu_hours for r in rs])),
                "over_oracle": float(np.mean(over)) if over else None,
                "scale_events_per_hour": float(np.mean([r.scale_events_per_hour for r in rs])),
                "reversals_per_hour": float(np.mean([r.reversals_per_hour for r in rs])),
                "outage_drop_max": int(max(drops)) if drops else None,
            })
    return rows


def verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets, per trace: Pareto against HPA, against the static pool, floors, flaps, outage."""
    out = []
    by = {(r["trace"], r["policy"]): r for r in rows}
    for trace in dict.fromkeys(r["trace"] for r in rows):
        p, h, st = by.get((trace, "policy")), by.get((trace, "hpa")), by.get((trace, "static"))
        if not p:
            continue
        v: dict[str, Any] = {"trace": trace}
        if h:
            pv, hv = p["violating_minutes"], h["violating_minutes"]
            gpu_ratio = p["gpu_hours"] / h["gpu_hours"] if h["gpu_hours"] else float("inf")
            fewer = pv * 2 <= hv if hv > 0 else pv == 0
            v.update(violating_minutes=[round(pv, 2), round(hv, 2)], gpu_vs_hpa=round(gpu_ratio, 3),
                     pareto_vs_hpa=(fewer and gpu_ratio <= 1.05) or (gpu_ratio <= 0.8 and pv <= hv))
        rb = by.get((trace, "reactive-bound"))
        if rb and h:
            # no policy reacting to measured load does better than this bound during a change: where it
            # is not 2x below HPA, that half of the target is out of reach for any of them
            v.update(reactive_bound_violating_minutes=round(rb["violating_minutes"], 2),
                     bound_allows_2x=rb["violating_minutes"] * 2 <= h["violating_minutes"])
        if st:
            v.update(gpu_vs_static=round(p["gpu_hours"] / st["gpu_hours"], 3),
                     beats_static=p["violating_minutes"] <= st["violating_minutes"] and
                     p["gpu_hours"] < st["gpu_hours"])
        if trace == "periodic":
            v.update(minute_attainment=round(p["minute_attainment"], 4), meets_99=p["minute_attainment"] >= 0.99)
        if trace == "poisson":
            v["zero_reversals"] = p["reversals_per_hour"] == 0
        if p["outage_drop_max"] is not None:
            v["held_during_outage"] = p["outage_drop_max"] == 0
        out.append(v)
    return out


def pool_bound(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """What fixed pools can buy, per trace run with pools of several sizes (``static``, ``static+K``) and HPA.

    The pool size is chosen per trace in hindsight and may be time-shared between two sizes (half the hour
    at 4, half at 5), so the choices are the lower convex hull of each trace's (GPU-hours, violating
    minutes). Returned: the fewest GPU-hours, against HPA's, for half HPA's violating minutes over the
    traces, and the fewest violating minutes at 80 % of HPA's GPU-hours (the target's two clauses). Where
    the load has nothing a forecast can follow — arrivals whose bursts last seconds at a constant mean,
    against a cold start of minutes — an autoscaler chooses no more than how many replicas to hold, so
    this is a bound on what any of them can reach there."""
    out = []
    for trace in dict.fromkeys(r.trace for r in results):
        hpa = {r.seed: r for r in results if r.trace == trace and r.policy == "hpa"}
        pools: dict[int, list[tuple[float, float]]] = {}
        for r in results:
            if r.trace == trace and r.seed in hpa and (r.policy == "static" or _pool_offset(r.policy) is not None):
                pools.setdefault(r.seed, []).append((r.gpu_hours, float(r.violating_minutes)))
        if not pools or min(len(v) for v in pools.values()) < 2:
            continue
        seeds = sorted(pools)
        path = _pool_path([_lower_hull(pools[s]) for s in seeds])
        hpa_gpu = sum(hpa[s].gpu_hours for s in seeds)
        hpa_viol = sum(hpa[s].violating_minutes for s in seeds)
        gpu = _along(path, viol=hpa_viol / 2)
        viol = _along(path, gpu=0.8 * hpa_gpu)
        out.append({"trace": trace, "seeds": len(seeds), "hpa_violating_minutes": round(hpa_viol / len(seeds), 2),
                    "pool_gpu_vs_hpa_at_half_hpa_violations": None if gpu is None else round(gpu / hpa_gpu, 3),
                    "pool_violating_minutes_at_0.8_hpa_gpu": None if viol is None else round(viol / len(seeds), 2)})
    return out


def _lower_hull(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (GPU-hours, violating minutes) choices worth making: cheapest first, each buying fewer violating
    minutes, at a rising price per minute (what time-sharing between two pools reaches is on the segment)."""
    hull: list[tuple[float, float]] = []
    for g, v in sorted(points):
        if hull and v >= hull[-1][1]:
            continue  # dearer and no better
        while len(hull) >= 2 and (hull[-1][0] - hull[-2][0]) * (hull[-2][1] - v) >= \
                (g - hull[-2][0]) * (hull[-2][1] - hull[-1][1]):
            hull.pop()  # under the segment from the one before: time-sharing beats it
        hull.append((g, v))
    return hull


def _pool_path(hulls: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Totals over the traces, from every trace at its cheapest pool, buying the cheapest violating minutes
    first (the fractional knapsack over the hulls' segments: exact for time-shared pools)."""
    gpu, viol = sum(h[0][0] for h in hulls), sum(h[0][1] for h in hulls)
    segments = sorted(((b[0] - a[0]) / (a[1] - b[1]), b[0] - a[0], a[1] - b[1])
                      for h in hulls for a, b in zip(h, h[1:]))
    path = [(gpu, viol)]
    for _, dg, dv in segments:
        gpu, viol = gpu + dg, viol - dv
        path.append((gpu, viol))
    return path


def _along(path: Sequence[tuple[float, float]], *, viol: float | None = None, gpu: float | None = None) -> float | None:
    """On the path: the GPU-hours that reach ``viol`` violating minutes, or the violating minutes ``gpu``
    GPU-hours reach (None: out of the pools' range)."""
    for (g0, v0), (g1, v1) in zip(path, path[1:]):
        if viol is not None and v1 <= viol <= v0:
            return g0 + (g1 - g0) * (v0 - viol) / (v0 - v1)
        if gpu is not None and g0 <= gpu <= g1:
            return v0 - (v0 - v1) * (gpu - g0) / (g1 - g0)
    if viol is not None and path and path[0][1] <= viol:
        return path[0][0]
    if gpu is not None and path and gpu >= path[-1][0]:
        return path[-1][1]
    return None


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "—"
    if pct:
        return f"{100 * v:.2f} %"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| trace | policy | requests ≤ SLO | minutes p95 ≤ SLO | worst seed | violating min | GPU-hours | "
             "vs oracle | scale ev/h | reversals/h | outage drop |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if frontier.scaled(r["policy"]):
            continue  # a swept target: in the frontier table
        lines.append(f"| {r['trace']} | {r['policy']} | {_fmt(r['request_attainment'], True)} | "
                     f"{_fmt(r['minute_attainment'], True)} | {_fmt(r['min_minute_attainment'], True)} | "
                     f"{r['violating_minutes']:.1f} | {r['gpu_hours']:.2f} | "
                     f"{_fmt(r['over_oracle'], True) if r['over_oracle'] is not None else '—'} | "
                     f"{r['scale_events_per_hour']:.1f} | {r['reversals_per_hour']:.1f} | "
                     f"{_fmt(r['outage_drop_max'])} |")
    return "\n".join(lines)


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def frontier_table(fronts: Sequence[dict[str, Any]]) -> str:
    """Per family and swept autoscaler: the policy's point, the frontier's violating minutes at its GPU-hours and
    GPU-hours at its violating minutes, and the verdict."""
    lines = ["| trace | against | policy: violating min, GPU-hours | frontier's violating min at the policy's "
             "GPU-hours | frontier's GPU-hours at the policy's violating min | verdict |",
             "|---|---|---|---|---|---|"]
    for f in fronts:
        p = f["policy"]
        lines.append(f"| {f['trace']} | {f['autoscaler']} | {p['violating_minutes']:.1f}, {p['gpu_hours']:.2f} | "
                     f"{_fmt(f['frontier_violating_minutes_at_policy_gpu_hours'])} | "
                     f"{_fmt(f['frontier_gpu_hours_at_policy_violating_minutes'])} | {f['verdict']} |")
    return "\n".join(lines)


def plot_frontiers(fronts: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """One figure per family: each swept autoscaler's targets and frontier, and the policy's point."""
    plt = _pyplot()
    colors = {"hpa": "tab:red", "hpa-arrival": "tab:pink", "keda": "tab:orange"}
    paths = []
    for trace in dict.fromkeys(f["trace"] for f in fronts):
        fig, ax = plt.subplots(figsize=(6, 4.5))
        mine = [f for f in fronts if f["trace"] == trace]
        for f in mine:
            c = colors.get(f["autoscaler"])
            xs, ys = [p["gpu_hours"] for p in f["points"]], [p["violating_minutes"] for p in f["points"]]
            ax.scatter(xs, ys, color=c, s=14, alpha=0.6)
            for p in f["points"]:
                ax.annotate(f"{p['target_x']:g}×", (p["gpu_hours"], p["violating_minutes"]), fontsize=6, color=c,
                            textcoords="offset points", xytext=(3, 3))
            fx, fy = zip(*f["frontier"])
            ax.plot(fx, fy, color=c, label=f"{f['autoscaler']} frontier (target 0.5–1.5×)")
        p = mine[0]["policy"]
        ax.scatter([p["gpu_hours"]], [p["violating_minutes"]], marker="*", s=160, color="tab:blue", zorder=3,
                   label="policy (against " + ", ".join(f"{f['autoscaler']}: {f['verdict']}" for f in mine) + ")")
        ax.set_xlabel("GPU-hours (mean over seeds)")
        ax.set_ylabel("violating minutes (mean over seeds)")
        ax.set_title(f"{trace}: the policy against HPA and KEDA tuned ({mine[0]['seeds']} seeds)", fontsize=9)
        ax.legend(fontsize=7)
        paths.append(_save(plt, fig, out / f"frontier-{trace}.png"))
    return paths


def plot(results: Sequence[RunResult], out: Path, cfg: SimConfig, pick: dict[str, int]) -> list[Path]:
    """One figure per trace (the seed in ``pick``): offered load, replicas, p95 per minute."""
    plt = _pyplot()
    paths = []
    colors = {"policy": "tab:blue", "hpa": "tab:red", "hpa-arrival": "tab:pink", "keda": "tab:orange",
              "oracle": "tab:green", "static": "tab:gray", "reactive-bound": "tab:purple", "sessions": "tab:cyan"}
    for trace, seed in pick.items():
        rs = [r for r in results if r.trace == trace and r.seed == seed and not frontier.scaled(r.policy)]
        if not rs:
            continue
        fig, ax = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
        minutes = np.arange(len(rs[0].series["rate"]))
        ax[0].plot(minutes, rs[0].series["rate"], color="black")
        ax[0].set_ylabel("offered req/s")
        for r in rs:
            ax[1].plot(minutes, r.series["replicas"], label=r.policy, color=colors.get(r.policy))
            ax[2].plot(minutes, np.minimum(r.series["p95_ms"], 60000), label=r.policy, color=colors.get(r.policy))
        ax[1].plot(minutes, rs[0].series["needed"], color="black", linestyle=":", label="needed")
        ax[1].set_ylabel("replicas (incl. warming)")
        ax[2].set_ylabel("p95 latency per minute (ms)")
        ax[2].axhline(cfg.slo_ms, linestyle="--", color="black", linewidth=0.8)
        ax[2].set_yscale("log")
        ax[2].set_xlabel("minute")
        ax[1].legend(loc="upper left", fontsize=8, ncol=4)
        params = ", ".join(f"{k} {v}" for k, v in rs[0].params.items() if k != "file")
        ax[0].set_title(f"{trace}: {params}", fontsize=9)
        paths.append(_save(plt, fig, out / f"autoscaling-{trace}-{seed}.png"))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import time

    ap = argparse.ArgumentParser(prog="cosyvoice-operator simulate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run_cli(ap.parse_args(argv), time.perf_counter)


def _outages(specs: Sequence[str]) -> list[tuple[float, float]]:
    out = []
    for spec in specs:
        try:
            a, b = (float(x) for x in spec.split(":"))
        except ValueError:
            raise ValueError(f"--outage {spec!r}: expected START:END in seconds, e.g. 1800:2400") from None
        out.append((a, b))
    return out


def load_traces(args: Any, cfg: SimConfig) -> list[tuple[Trace, int]]:
    outages = _outages(args.outage)
    path = args.trace_file
    if args.from_prometheus:
        path = args.save_trace or "prometheus-trace.csv"
        range_s, step_s = traces.parse_duration(args.range), traces.parse_duration(args.step)
        if not 0 < range_s <= MAX_TRACE_S or not 0 < step_s <= range_s:
            raise ValueError(f"--range {args.range} --step {args.step}: expected 0 < step ≤ range ≤ "
                             f"{MAX_TRACE_S // 86400}d")
        traces.export_prometheus(args.from_prometheus, args.query, range_s, step_s, args.audio_query, path)
        print(f"wrote {path}")
    if path:
        trace = traces.read_csv(path, cfg.audio_s, outages)
        if args.history:
            lead = traces.parse_duration(args.history)
            if not 0 <= lead <= trace.duration - 60:
                raise ValueError(f"--history {args.history}: the trace is {trace.duration} s long; its history must "
                                 "leave at least a minute to score")
            trace = replace(trace, lead_s=int(lead))
        return [(trace, s) for s in range(args.seeds)]
    if args.history:
        raise ValueError("--history applies to --trace-file or --from-prometheus traces (generated ones have theirs)")
    if outages:
        raise ValueError("--outage applies to --trace-file or --from-prometheus traces")
    families = args.traces.split(",")
    unknown = [f for f in families if f not in traces.FAMILIES]
    if unknown:
        raise ValueError(f"unknown trace family {unknown[0]!r}; the families are {', '.join(traces.FAMILIES)} "
                         "(--trace-file replays your own)")
    available = len(traces.SETS[args.set].seeds)
    if args.seeds > available:
        raise ValueError(f"--seeds {args.seeds}: the {args.set} set has {available} traces per family")
    return generated(families, args.set, args.seeds, cfg)


def run_cli(args: Any, clock: Callable[[], float]) -> int:
    import sys

    try:
        cfg = SimConfig(**{k: getattr(args, k) for k in SimConfig.__dataclass_fields__})
        settings = None
        if args.service:
            text = sys.stdin.read() if args.service == "-" else Path(args.service).read_text()
            cfg, settings, taken = service_config(text, cfg)
            print(taken, file=sys.stderr)
        load_profile(cfg)
        work = load_traces(args, cfg)
        policies = args.policies.split(",")
        for p in policies:
            if not valid_policy(p):
                raise ValueError(f"unknown policy {p!r}")
        if args.frontier:
            if "policy" not in policies:
                raise ValueError("--frontier places the policy against HPA's and KEDA's frontiers: add policy to "
                                 "--policies")
            policies += [p for base in ("hpa", "keda") for p in frontier.sweep(base, args.frontier)
                         if p not in policies]
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = clock()
    results = run_all(work, policies, cfg, args.jobs, settings=settings)
    rows = summarize(results)
    checks = verdicts(rows)
    bounds = pool_bound(results)
    fronts = frontier.report(rows)
    if args.json:
        print(json.dumps({"rows": rows, "verdicts": checks, "pool_bounds": bounds, "frontiers": fronts}, indent=1))
    else:
        print(markdown_table(rows))
        if fronts:
            print(frontier_table(fronts))
        for v in checks + bounds:
            print(json.dumps(v))
        print(f"{len(results)} runs in {clock() - t0:.0f} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tables = [markdown_table(rows)] + ([frontier_table(fronts)] if fronts else [])
        (out / "results.md").write_text("\n\n".join(tables) + "\n")
        (out / "results.json").write_text(json.dumps(
            {"config": asdict(cfg), "cold_start": asdict(cold_start(cfg, load_profile(cfg))), "service": args.service,
             "set": None if args.trace_file or args.from_prometheus else args.set,
             "rows": rows, "verdicts": checks, "pool_bounds": bounds, "frontiers": fronts,
             "runs": [replace(r, series={}).__dict__ for r in results]},
            indent=1, default=str))
        plot(results, out, cfg, {t.name: s for t, s in reversed(work)})
        plot_frontiers(fronts, out)
    return 0
