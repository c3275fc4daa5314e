"""Traffic for the simulator: randomised trace families, a user's CSV, or a range exported from Prometheus.

A trace is the offered arrival rate (requests/s) and the mean request length (seconds of audio per
request) for every second, plus optional metric outages (the service's series vanish). Generated
families express load in replicas' worth (``unit_rps``: what one replica takes within the SLO), so
the same family means the same thing on any capacity profile. Every family precedes the scored
part with ``lead_s`` of its own history (scored by no one, seen by every autoscaler, as Prometheus
would hold it), long enough for two periods of a periodic family.

Two sets are fixed (``SETS``): ``tuning`` (what the policy's defaults were chosen on) and
``heldout`` (other seeds, other parameter ranges; the results in docs/autoscaling.md).
"""
from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .simconfig import MAX_TRACE_S

FAMILIES = ("step", "ramp", "periodic", "bursty", "poisson", "outage", "mixed")


@dataclass
class Trace:
    name: str
    rate: np.ndarray  # offered requests/s, one value per second (lead included)
    audio_s: np.ndarray  # mean seconds of audio per request, per second
    outages: list[tuple[float, float]] = field(default_factory=list)  # seconds, trace time
    lead_s: int = 0  # the first lead_s seconds are history: simulated, not scored
    params: dict[str, float | str] = field(default_factory=dict)
    burst_cv: float = 1.0  # coefficient of variation of inter-arrival times (1: Poisson)

    @property
    def duration(self) -> int:
        return len(self.rate)


@dataclass(frozen=True)
class TraceSet:
    """A family's parameter ranges and seeds. ``heldout`` draws from ranges the tuning set does not use."""
    name: str
    seeds: tuple[int, ...]
    periods_min: tuple[float, float]  # periodic: period range (minutes)
    step_x: tuple[float, float]  # step: size of the step (× the base load)
    ramp_min: tuple[float, float]  # ramp: minutes from base to peak
    burst_cv: tuple[float, float]
    shape: tuple[str, ...]  # periodic waveforms


SETS = {
    "tuning": TraceSet("tuning", tuple(range(10)), (5, 30), (2, 4), (10, 30), (2, 3), ("square", "sine")),
    "heldout": TraceSet("heldout", tuple(range(1000, 1010)), (10, 60), (3, 6), (20, 60), (2.5, 4),
                        ("square", "sine", "sawtooth")),
}


def _wave(shape: str, phase: np.ndarray) -> np.ndarray:
    """0..1 over one period (phase in [0, 1))."""
    if shape == "square":
        return (phase < 0.5).astype(float)
    if shape == "sine":
        return 0.5 - 0.5 * np.cos(2 * math.pi * phase)
    return phase  # sawtooth: a slow climb, then a drop


def generate(family: str, seed: int, ts: TraceSet, unit_rps: float, audio_s: float,
             minutes: float = 60.0) -> Trace:
    """One trace of ``family`` drawn with ``seed`` from ``ts``'s ranges; ``minutes`` scored."""
    rng = np.random.default_rng([seed, FAMILIES.index(family)])
    n = int(minutes * 60)
    base = unit_rps * rng.uniform(1.5, 3.0)  # 1.5-3 replicas' worth
    lead = 20 * 60
    params: dict[str, float | str] = {"base_rps": round(base, 2)}
    outages: list[tuple[float, float]] = []
    cv = 1.0
    audio = np.full(n, audio_s)
    if family == "step":
        x = rng.uniform(*ts.step_x)
        at, hold = rng.uniform(5, 20) * 60, rng.uniform(10, 30) * 60
        t = np.arange(n)
        rate = np.where((t >= at) & (t < at + hold), x * base, base)
        params.update(step_x=round(x, 2), at_s=round(at), hold_s=round(hold))
    elif family == "ramp":
        x, r = rng.uniform(2, 5), rng.uniform(*ts.ramp_min) * 60
        at = rng.uniform(5, 15) * 60
        t = np.arange(n)
        up = np.clip((t - at) / r, 0, 1)
        down = np.clip((t - (at + r + 10 * 60)) / r, 0, 1)  # held 10 min, then back down as slowly
        rate = base * (1 + (x - 1) * (up - down))
        params.update(peak_x=round(x, 2), ramp_s=round(r), at_s=round(at))
    elif family == "periodic":
        period = rng.uniform(*ts.periods_min) * 60
        x = rng.uniform(2, 4)
        shape = str(rng.choice(ts.shape))
        lead = int(2 * period + 10 * 60)  # two periods in Prometheus before the scored part
        phase0 = rng.uniform(0, 1)
        t = np.arange(-lead, n)
        rate = base * (1 + (x - 1) * _wave(shape, ((t / period) + phase0) % 1.0))
        params.update(period_s=round(period), peak_x=round(x, 2), shape=shape)
        return _finish(family, seed, rate, np.full(len(rate), audio_s), lead, outages, params, cv)
    elif family == "bursty":
        cv = rng.uniform(*ts.burst_cv)
        rate = np.full(n, base)
        params.update(cv=round(cv, 2))
    elif family == "poisson":
        rate = np.full(n, base)
    elif family == "outage":
        # load moves around a metrics outage: a step or a ramp up, the outage starting up to 5 min
        # before or after the change
        x = rng.uniform(2, 4)
        at = rng.uniform(15, 25) * 60
        t = np.arange(n)
        if rng.uniform() < 0.5:
            rate = np.where(t >= at, x * base, base)
            kind = "step"
        else:
            rate = base * (1 + (x - 1) * np.clip((t - at) / (15 * 60), 0, 1))
            kind = "ramp"
        start = at + rng.uniform(-5, 5) * 60
        length = rng.uniform(5, 15) * 60
        outages = [(lead + start, lead + start + length)]
        params.update(kind=kind, peak_x=round(x, 2), change_s=round(at), outage_start_s=round(start),
                      outage_s=round(length))
    elif family == "mixed":
        # the same request rate, the request length switching between mostly short and mostly long
        long_share_lo, long_share_hi = rng.uniform(0.0, 0.2), rng.uniform(0.6, 0.9)
        period = rng.uniform(15, 40) * 60
        lead = int(2 * period + 10 * 60)
        t = np.arange(n)
        share = np.where(((t / period) % 1.0) < 0.5, long_share_lo, long_share_hi)
        short, long_ = audio_s / 3, audio_s * 2
        audio = short + (long_ - short) * share
        rate = np.full(n, base)
        params.update(long_share=f"{long_share_lo:.2f}-{long_share_hi:.2f}", period_s=round(period))
        t = np.arange(-lead, 0)
        lead_audio = short + (long_ - short) * np.where(((t / period) % 1.0) < 0.5, long_share_lo, long_share_hi)
        return _finish(family, seed, np.full(lead + n, base), np.concatenate([lead_audio, audio]), lead, outages,
                       params, cv)
    else:
        raise ValueError(f"unknown trace family {family!r} (one of {', '.join(FAMILIES)})")
    lead_rate = np.full(lead, rate[0])
    lead_audio = np.full(lead, audio[0])
    return _finish(family, seed, np.concatenate([lead_rate, rate]), np.concatenate([lead_audio, audio]), lead,
                   outages, params, cv)


def _finish(family: str, seed: int, rate: np.ndarray, audio: np.ndarray, lead: int,
            outages: list[tuple[float, float]], params: dict[str, float | str], cv: float) -> Trace:
    return Trace(family, np.asarray(rate, dtype=float), np.asarray(audio, dtype=float), outages, lead,
                 {"seed": seed, **params}, cv)


MAX_REQUESTS = 50_000_000  # every request is simulated: about 25 bytes and 50 µs each


def read_csv(path: str | Path, default_audio_s: float, outages: Sequence[tuple[float, float]] = ()) -> Trace:
    """A trace from ``t_seconds,rate_rps[,mean_audio_s]`` rows (a header line is allowed). The time is seconds
    (from any origin) or a date and time as Grafana's CSV export and spreadsheets write it (ISO 8601; only the
    differences count, so a missing offset does not matter). Each row's values hold until the next row's time;
    the last row holds for one more interval."""
    rows: list[tuple[float, float, float]] = []
    header_allowed = True
    dated: bool | None = None  # whether the file's times are dates (set by its first row)
    previous = ""  # the last row's time, as written
    with open(path, newline="", encoding="utf-8-sig") as f:
        for i, row in enumerate(csv.reader(f), 1):
            if not row or row[0].strip().startswith("#"):
                continue
            stamp = _timestamp(row[0])
            if header_allowed and not _is_number(row[0]) and stamp is None:
                header_allowed = False
                continue  # the header: the first line only, so rows in another format are reported, not skipped
            header_allowed = False
            line = ",".join(row)  # as written, for the errors
            dated = stamp is not None if dated is None else dated
            if (stamp is not None) != dated:
                kind = "a date and time" if dated else "seconds"
                raise ValueError(f"{path}:{i}: expected {kind} like the first row's, got {line!r}")
            try:
                t, rate = stamp if stamp is not None else float(row[0]), float(row[1])
                audio = float(row[2]) if len(row) > 2 and row[2].strip() else default_audio_s
                malformed = any(x.strip() for x in row[3:])  # a fourth column
            except (ValueError, IndexError):
                malformed = True
            if malformed:
                # a spreadsheet saved in a locale whose decimal mark is the comma separates with ';' or tabs
                hint = next((f" (columns separated by {sep!r}: save with commas between columns and '.' as the "
                             "decimal mark)" for sep in (";", "\t") if sep in line), "")
                raise ValueError(f"{path}:{i}: expected t_seconds,rate_rps[,mean_audio_s], got {line!r}{hint}")
            if not all(math.isfinite(x) for x in (t, rate, audio)):
                raise ValueError(f"{path}:{i}: every value must be a finite number, got {line!r}")
            if rate < 0 or audio <= 0:
                raise ValueError(f"{path}:{i}: the rate must be ≥ 0 and the audio length > 0")
            if rows and t <= rows[-1][0]:
                raise ValueError(f"{path}:{i}: the times must increase ({row[0].strip()} after {previous})")
            rows.append((t, rate, audio))
            previous = row[0].strip()
    if not rows:
        raise ValueError(f"{path}: no rows (expected t_seconds,rate_rps[,mean_audio_s])")
    t0 = rows[0][0]
    step = rows[1][0] - rows[0][0] if len(rows) > 1 else 60.0
    end = int(math.ceil(rows[-1][0] - t0 + step))
    if end > MAX_TRACE_S:
        raise ValueError(f"{path}: the trace spans {end / 86400:.1f} days; at most {MAX_TRACE_S / 86400:.0f} are "
                         "replayed (is t_seconds in seconds?)")
    # each row holds until the next: its rate times its duration is the requests it sends
    durations = [b[0] - a[0] for a, b in zip(rows, rows[1:])] + [step]
    requests = sum(r[1] * d for r, d in zip(rows, durations))
    if requests > MAX_REQUESTS:
        raise ValueError(f"{path}: the trace sends about {requests:.3g} requests; the simulator replays every "
                         f"request and takes at most {MAX_REQUESTS:.0e} per run: replay a shorter range")
    starts = np.array([r[0] - t0 for r in rows])
    idx = np.searchsorted(starts, np.arange(end), side="right") - 1
    rate = np.array([r[1] for r in rows])[idx]
    audio = np.array([r[2] for r in rows])[idx]
    for a, b in outages:
        if not 0 <= a < b:
            raise ValueError(f"--outage {a:g}:{b:g}: expected START:END seconds with 0 ≤ START < END")
        if a >= end:
            raise ValueError(f"--outage {a:g}:{b:g}: starts after the trace ends ({end} s; times are seconds from "
                             "its first row)")
    return Trace(Path(path).stem, rate, audio, list(outages), 0, {"file": str(path)})


def _timestamp(text: str) -> float | None:
    """Seconds since the epoch of an ISO 8601 date and time (``2026-11-25T10:00:00Z``, ``2026-11-25 10:00:00``;
    without an offset, UTC), or None when the text is not one (a bare number is seconds, not a date)."""
    text = text.strip()
    if _is_number(text) or len(text) < 10:  # fromisoformat would read "20261125" as a date
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def parse_duration(text: str) -> float:
    """Prometheus-style durations: 90s, 30m, 12h, 7d, 1w (or plain seconds)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = text.strip()
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 30m, 12h, 7d)") from None


def export_prometheus(url: str, query: str, range_s: float, step_s: float, audio_query: str | None,
                      out: str | Path, end: float | None = None) -> Path:
    """Write ``query`` (requests/s) over the last ``range_s`` as a trace CSV; ``audio_query`` (mean audio
    seconds per request) fills the optional third column. Gaps in the data are written as gaps in time
    (the simulator holds the last value), not as zeros."""
    from .prometheus import QueryFailed, connect_range

    stop = dt.datetime.fromtimestamp(end if end is not None else dt.datetime.now().timestamp(), dt.timezone.utc)
    start = stop - dt.timedelta(seconds=range_s)
    try:
        fetch = connect_range(url)
        rates = fetch(query, start, stop, step_s)
        audio = fetch(audio_query, start, stop, step_s) if audio_query and rates else {}
    except QueryFailed as exc:
        raise ValueError(f"Prometheus at {url}: {exc}") from None
    if not rates:
        raise ValueError(f"Prometheus returned no samples for {query!r} over the last {range_s:.0f} s")
    t0 = min(rates)
    path = Path(out)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_seconds", "rate_rps", "mean_audio_s"] if audio else ["t_seconds", "rate_rps"])
        for t in sorted(rates):
            row = [f"{t - t0:.0f}", f"{max(0.0, rates[t]):.4f}"]
            if audio:
                a = audio.get(t)
                row.append(f"{a:.3f}" if a and a > 0 else "")
            w.writerow(row)
    return path
