"""A replica's measured capacity (``bench.capacity``) and the load one replica can take within a latency SLO.

A profile holds, for a few request lengths (mean audio seconds per request), the closed-loop latency
at each concurrency up to the server's batch size. Read as a model of one replica:

* a request admitted with ``c`` requests in service (itself included, ``c ≤ max_batch_size``) takes
  ``mean_latency_s(c, audio_s)`` on average, lognormally spread (``sigma``, from the measured p95/p50);
  beyond the batch size requests queue, served at the full batch's throughput;
* the simulator replays exactly that, and the policy sizes replicas with the queue it implies:
  ``rate_at_slo`` is the Poisson arrival rate per replica at which the p95 of response time meets the
  objective (a birth-death chain with the measured, load-dependent service rate; arrivals see its
  stationary state). Kubernetes Services spread requests at random, so each replica sees a Poisson
  share of the service's arrivals, and the replicas needed are ``arrivals / rate_at_slo``;
* bursty arrivals are modelled as geometric clumps (``clump``: their mean size), which random routing
  shares out (``clump_size``): the same chain, stepping up by a clump at a time;
* ``cold_start``: how long a new replica takes from pod creation to serving, measured twice (``bench.startup``):
  on a node whose model cache already holds the model (a hit) and on one that must fetch it first (a miss).
  The policy forecasts a miss ahead; the simulator pays a miss for each replica beyond the most that ran
  at once before (a node new to the model), a hit otherwise. It is the one place these numbers live.
"""
from __future__ import annotations

import bisect
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROFILES = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "tiny-cpu"
# A profile that measured no start (a file written by bench.capacity alone), and a policy without a profile:
# a GPU replica's start as assumed before it was measured (image pull, a ~2 GB model fetch, load, warm-up)
ASSUMED_COLD_START_S = 120.0
Z95 = 1.6448536269514722  # standard normal quantile of 0.95


@dataclass(frozen=True)
class Length:
    audio_s: float
    concurrency: tuple[int, ...]
    latency_s: tuple[float, ...]  # mean latency at each concurrency


@dataclass(frozen=True)
class ColdStart:
    """Seconds from a pod's creation to its first answer, with the model on the node (``hit_s``) or not
    (``miss_s``), and where they come from."""
    hit_s: float
    miss_s: float
    source: str


ASSUMED = ColdStart(ASSUMED_COLD_START_S, ASSUMED_COLD_START_S, "assumed, not measured")


def cold_start_from(raw: Any, name: str = "custom") -> ColdStart:
    """A profile's ``cold_start`` section (``{"cache_hit_s", "cache_miss_s", "source"}``); none: the assumption."""
    if raw is None:
        return ASSUMED
    hit, miss = float(raw["cache_hit_s"]), float(raw["cache_miss_s"])
    if not (math.isfinite(hit) and math.isfinite(miss) and 0 <= hit <= miss):
        raise ValueError(f"capacity profile {name!r}: cold_start needs 0 ≤ cache_hit_s ≤ cache_miss_s, "
                         f"got {hit:g} and {miss:g}")
    return ColdStart(hit, miss, str(raw.get("source", "")))


@dataclass(frozen=True)
class Profile:
    name: str
    max_batch_size: int
    max_queue_size: int
    lengths: tuple[Length, ...]  # sorted by audio_s
    sigma: float  # lognormal spread of one request's latency around the mean
    cold_start: ColdStart = ASSUMED

    def mean_latency_s(self, concurrency: float, audio_s: float) -> float:
        c = min(max(concurrency, 1.0), float(self.max_batch_size))
        values = [_interp(c, L.concurrency, L.latency_s) for L in self.lengths]
        xs = [L.audio_s for L in self.lengths]
        if len(xs) == 1:
            return values[0] * audio_s / xs[0]
        # linear in the audio length (extrapolated past the measured lengths: the work is per token),
        # never below a fifth of the shortest measured request (fixed per-request costs)
        i = min(max(bisect.bisect_left(xs, audio_s), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], values[i - 1], values[i]
        return max(0.2 * values[0], y0 + (y1 - y0) * (audio_s - x0) / (x1 - x0))

    def throughput(self, concurrency: int, audio_s: float) -> float:
        """Completions per second with ``concurrency`` requests in service (the queue's service rate)."""
        c = min(concurrency, self.max_batch_size)
        return c / self.mean_latency_s(c, audio_s)

    def p95_s(self, rate: float, audio_s: float, clump: float = 1.0) -> float:
        """The p95 of response time for Poisson arrivals at ``rate`` per second to one replica; with
        ``clump`` > 1, arrivals come in clumps of that mean size (bursty traffic, at the same mean rate)."""
        return _p95(self, round(rate, 3), round(audio_s, 2), round(max(clump, 1.0), 1))

    def rate_at_slo(self, slo_s: float, audio_s: float, clump: float = 1.0) -> float:
        """The highest arrival rate per replica whose p95 response time is within ``slo_s`` (0: never)."""
        return _rate_at_slo(self, round(slo_s, 4), round(audio_s, 1), round(max(clump, 1.0), 1))


def clump_size(dispersion: float, replicas: float) -> float:
    """The mean clump one replica receives when the service's arrivals have index of dispersion
    ``dispersion`` (variance over mean of the counts; 1: Poisson) and are spread at random over ``replicas``.

    Arrivals in geometric clumps of mean m have dispersion 2m - 1; random routing passes each request of a
    clump to a replica independently, so one replica's share has dispersion 1 + (dispersion - 1) / replicas.
    """
    share = 1.0 + max(0.0, dispersion - 1.0) / max(replicas, 1.0)
    return (share + 1.0) / 2.0


def _interp(x: float, xs: tuple[int, ...], ys: tuple[float, ...]) -> float:
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[-1]


def _ln_cdf(t: float, mean: float, sigma: float) -> float:
    if t <= 0:
        return 0.0
    mu = math.log(mean) - sigma * sigma / 2
    return 0.5 * (1 + math.erf((math.log(t) - mu) / (sigma * math.sqrt(2))))


def _states(p: Profile, rate: float, audio_s: float, clump: float = 1.0) -> list[tuple[float, float, float]]:
    """(probability an arrival finds n in the system, its mean service time, its queueing wait) per n.

    Arrivals come in clumps of geometric size with mean ``clump`` (1: Poisson), at ``rate / clump`` clumps
    per second; the replica serves one at a time at the measured, load-dependent rate. The chain only steps
    down by one, so the flow across each cut gives the next state's probability from the ones below:
    ``μ(n+1) π(n+1) = rate/clump · Σ_{i≤n} π(i) P(size > n - i)``. A request finds the clump's arrival
    state plus the requests of its own clump ahead of it.
    """
    b = p.max_batch_size
    q = 1.0 - 1.0 / clump  # P(size > k) = q^k
    weights, cut = [1.0], 1.0  # cut: Σ_{i≤n} π(i) q^(n-i), unnormalised
    for n in range(b + p.max_queue_size - 1):
        w = rate / clump * cut / p.throughput(min(n + 1, b), audio_s)
        weights.append(w)
        cut = q * cut + w
        if n + 1 > b and w < 1e-7 * max(weights):
            break
    total = sum(weights)
    # a request is j-th in its clump with probability q^(j-1) / clump: it finds n + j - 1 in the system
    found, ahead = [], 0.0
    for n in range(len(weights)):
        ahead = q * ahead + weights[n] / total / clump
        found.append(ahead)
    full = p.throughput(b, audio_s)
    out = []
    for n, pr in enumerate(found):
        wait = 0.0 if n < b else (n - b + 1) / full
        out.append((pr, p.mean_latency_s(min(n + 1, b), audio_s), wait))
    return out


@functools.lru_cache(maxsize=4096)
def _p95(p: Profile, rate: float, audio_s: float, clump: float = 1.0) -> float:
    if rate >= p.throughput(p.max_batch_size, audio_s):
        return math.inf
    states = _states(p, rate, audio_s, clump)
    mass = sum(pr for pr, _, _ in states)  # below 1 by what a clump pushes past the states kept

    def cdf(t: float) -> float:
        return sum(pr * _ln_cdf(t - q, s, p.sigma) for pr, s, q in states) / mass

    lo, hi = 0.0, max(s + q for _, s, q in states) * 10
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.95 else (lo, mid)
    return hi


@functools.lru_cache(maxsize=4096)
def _rate_at_slo(p: Profile, slo_s: float, audio_s: float, clump: float = 1.0) -> float:
    full = p.throughput(p.max_batch_size, audio_s)
    lo, hi = 0.0, full * 0.999
    if p.p95_s(1e-6, audio_s, clump) > slo_s:
        return 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p.p95_s(mid, audio_s, clump) <= slo_s else (lo, mid)
    return lo


def from_dict(raw: dict[str, Any], batching: Any = None) -> Profile:
    """A profile from ``bench.capacity``'s JSON; ``batching`` (max_batch_size, max_queue_size) overrides the
    measured server's, e.g. with a CR's own ``spec.batching``."""
    bsize = int(getattr(batching, "max_batch_size", None) or raw["batching"]["max_batch_size"])
    qsize = int(getattr(batching, "max_queue_size", None) or raw["batching"]["max_queue_size"])
    lengths, spreads = [], []
    for points in raw["lengths"].values():
        points = sorted((p for p in points if p["concurrency"] <= raw["batching"]["max_batch_size"]
                         and p.get("requests")), key=lambda p: p["concurrency"])
        if not points:
            continue
        lengths.append(Length(float(sum(p["audio_s"] for p in points) / len(points)),
                              tuple(int(p["concurrency"]) for p in points),
                              tuple(p["latency_mean_ms"] / 1000 for p in points)))
        spreads += [math.log(p["latency_p95_ms"] / p["latency_p50_ms"]) / Z95 for p in points
                    if p["latency_p95_ms"] > p["latency_p50_ms"] > 0]
    if not lengths:
        raise ValueError(f"capacity profile {raw.get('name')!r} has no measured points")
    sigma = max(0.05, sum(spreads) / len(spreads)) if spreads else 0.3
    return Profile(str(raw.get("name", "custom")), bsize, qsize, tuple(sorted(lengths, key=lambda L: L.audio_s)),
                   sigma, cold_start_from(raw.get("cold_start"), str(raw.get("name", "custom"))))


def names() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.json"))


def load(name_or_path: str = DEFAULT_PROFILE, batching: Any = None) -> Profile:
    """A bundled profile by name (``tiny-cpu``), or a JSON file written by ``python -m bench.capacity``."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES / f"{name_or_path}.json"
        if not path.exists():
            raise ValueError(f"unknown capacity profile {name_or_path!r}; bundled: {', '.join(names())}")
    try:
        return from_dict(json.loads(path.read_text()), batching)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"capacity profile {path} is not a profile written by bench.capacity "
                         f"({type(exc).__name__}: {exc})") from None
