"""HPA tuned fairly: its per-pod target swept, and the policy placed against the frontier that sweep traces.

A fixed target is one choice of HPA's trade between GPU-hours and SLO: a lower target holds more replicas
and violates fewer minutes. Swept from half to one and a half times the default target (``sweep``), HPA
gives a point per target on each trace family (means over the seeds); the points no other point beats on
both (``pareto``) are what an operator tuning HPA for that family can reach, and between two targets the
frontier is interpolated linearly. The policy is **better** than HPA on a family when HPA, tuned to spend the
policy's GPU-hours, violates more minutes (``compare``); outside the frontier's GPU-hours it is better only
by dominating a point of it (cheaper and no worse), worse by being dominated, and otherwise not comparable.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Point = tuple[float, float]  # (GPU-hours, violating minutes)
SWEPT = ("hpa", "hpa-arrival", "keda")  # the autoscalers whose per-pod target can be swept
LOWEST, HIGHEST = 0.5, 1.5  # the sweep's range, as multiples of the default target


def sweep(base: str, points: int) -> list[str]:
    """The scaler names of ``base`` at ``points`` targets from 0.5× to 1.5× of its default (``hpa@0.7``; the
    default itself keeps its plain name, so the sweep includes the run the rest of the report uses)."""
    names = []
    for x in np.linspace(LOWEST, HIGHEST, points):
        x = round(float(x), 4)
        names.append(base if x == 1.0 else f"{base}@{x:g}")
    return names


def scaled(name: str) -> tuple[str, float] | None:
    """(base, multiple of its target) of a name like ``keda@1.2``; None when it is not one."""
    base, at, value = name.partition("@")
    if not at or base not in SWEPT:
        return None
    try:
        x = float(value)
    except ValueError:
        return None
    return (base, x) if x > 0 else None


def _target_x(name: str, base: str) -> float | None:
    """The multiple of ``base``'s default target that scaler ``name`` runs at (None: another scaler)."""
    if name == base:
        return 1.0
    s = scaled(name)
    return s[1] if s and s[0] == base else None


def dominates(a: Point, b: Point) -> bool:
    """``a`` spends no more GPU-hours and violates no more minutes than ``b``, and is strictly better on one."""
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other point dominates, cheapest first (so each violates fewer minutes than the one before)."""
    front: list[Point] = []
    for p in sorted(set(points)):
        if not front or p[1] < front[-1][1]:
            front.append(p)
    return front


def violations_at(front: Sequence[Point], gpu_hours: float) -> float | None:
    """The violating minutes the frontier reaches at ``gpu_hours`` (linear between its points); None outside
    the GPU-hours it spans."""
    if not front or not front[0][0] <= gpu_hours <= front[-1][0]:
        return None
    for (g0, v0), (g1, v1) in zip(front, front[1:]):
        if g0 <= gpu_hours <= g1:
            return v0 + (v1 - v0) * (gpu_hours - g0) / (g1 - g0)
    return front[0][1]  # a frontier of one point, at exactly its GPU-hours


def gpu_hours_at(front: Sequence[Point], violating_minutes: float) -> float | None:
    """The fewest GPU-hours on the frontier that violate at most ``violating_minutes``; None when no point of it
    violates that few."""
    if not front or violating_minutes < front[-1][1]:
        return None
    if violating_minutes >= front[0][1]:
        return front[0][0]
    for (g0, v0), (g1, v1) in zip(front, front[1:]):
        if v1 <= violating_minutes <= v0:
            return g0 + (g1 - g0) * (v0 - violating_minutes) / (v0 - v1)
    return None  # unreachable for a frontier from ``pareto``


Verdict = Literal["better", "even", "worse", "not comparable"]


@dataclass(frozen=True)
class Comparison:
    verdict: Verdict
    frontier_violating_minutes: float | None  # HPA tuned to the policy's GPU-hours (None: outside the frontier)
    frontier_gpu_hours: float | None  # the fewest GPU-hours HPA needs for the policy's violating minutes
    why: str


def compare(policy: Point, front: Sequence[Point]) -> Comparison:
    """Where ``policy`` lies against the frontier ``front`` (from ``pareto``)."""
    if not front:
        raise ValueError("an empty frontier: sweep at least one target")
    gpu, viol = policy
    at = violations_at(front, gpu)
    need = gpu_hours_at(front, viol)
    if at is not None:
        verdict: Verdict = "better" if viol < at else "worse" if viol > at else "even"
        return Comparison(verdict, at, need, f"tuned to {gpu:.2f} GPU-hours, HPA violates {at:.1f} minutes "
                                             f"against the policy's {viol:.1f}")
    low, high = front[0], front[-1]
    if any(dominates(policy, p) for p in front):
        return Comparison("better", None, need, f"cheaper than HPA's cheapest target ({low[0]:.2f} GPU-hours, "
                                                f"{low[1]:.1f} violating minutes) and violating no more")
    if any(dominates(p, policy) for p in front):
        return Comparison("worse", None, need, f"dearer than HPA's dearest target ({high[0]:.2f} GPU-hours, "
                                               f"{high[1]:.1f} violating minutes) and violating no fewer")
    side = "fewer" if gpu < low[0] else "more"
    return Comparison("not comparable", None, need,
                      f"{side} GPU-hours than any swept HPA target ({low[0]:.2f}–{high[0]:.2f}), and no point of "
                      "the frontier dominates it or is dominated by it")


def report(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace family and swept autoscaler: its points (means over the seeds), the frontier, the policy's point
    and the comparison. ``rows`` are ``simulate.summarize``'s."""
    out = []
    for trace in dict.fromkeys(r["trace"] for r in rows):
        mine = [r for r in rows if r["trace"] == trace]
        policy = next((r for r in mine if r["policy"] == "policy"), None)
        for base in SWEPT:
            points = []
            for r in mine:
                x = _target_x(r["policy"], base)
                if x is not None:
                    points.append({"target_x": x, "gpu_hours": round(r["gpu_hours"], 4),
                                   "violating_minutes": round(r["violating_minutes"], 2)})
            if len(points) < 2 or policy is None:
                continue
            points.sort(key=lambda p: p["target_x"])
            front = pareto([(p["gpu_hours"], p["violating_minutes"]) for p in points])
            here = (round(policy["gpu_hours"], 4), round(policy["violating_minutes"], 2))
            c = compare(here, front)
            out.append({"trace": trace, "autoscaler": base, "seeds": policy["seeds"], "points": points,
                        "frontier": [list(p) for p in front],
                        "policy": {"gpu_hours": here[0], "violating_minutes": here[1]},
                        "verdict": c.verdict,
                        "frontier_violating_minutes_at_policy_gpu_hours":
                            None if c.frontier_violating_minutes is None else round(c.frontier_violating_minutes, 2),
                        "frontier_gpu_hours_at_policy_violating_minutes":
                            None if c.frontier_gpu_hours is None else round(c.frontier_gpu_hours, 3),
                        "why": c.why})
    return out
