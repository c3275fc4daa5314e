"""The autoscaler's decision history as it is kept in ``status.autoscaling.history``.

Stabilization windows, rate-limit periods, the outage fallback (failures, the last reading, its
trend and forecast) and the recurring period all live in ``policy.History``. Persisting it in the
CR's status means a restarted operator, or a new leader, resumes every window where it was instead
of starting blind (no scale-down for a whole window) or, worse, forgetting a recent peak. Times are
seconds since the epoch, so they survive a restart and a move to another node.
"""
from __future__ import annotations

import math
from typing import Any

from .policy import History


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ratio(value: Any) -> float | None:
    """A latency ratio the guardrail could have recorded (over the band, so above 1); anything else is none:
    a lower one written into the status would stop the guardrail in every breach."""
    number = _num(value)
    return number if number is not None and math.isfinite(number) and number > 1.0 else None


def dump(h: History) -> dict[str, Any]:
    out: dict[str, Any] = {
        "recommendations": [{"time": round(t, 3), "replicas": r} for t, r in h.recommendations],
        "scaleEvents": [{"time": round(t, 3), "change": d} for t, d in h.scale_events],
        "failures": h.failures,
        "hotSince": h.hot_since, "burstTime": h.burst_at, "lastReadingTime": h.last_ok,
        "lastDemandQPS": h.last_demand, "lastSlope": h.last_slope, "lastAudioSeconds": h.last_audio_s,
        "seasonSeconds": h.season_s, "seasonCheckedTime": h.season_checked,
        "forecastReplicas": list(h.forecast), "forecastStepSeconds": h.forecast_step_s,
        "undercount": h.undercount if h.undercount_at is not None else None, "undercountTime": h.undercount_at,
        "guardLatencyRatio": h.guard_ratio,
    }
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items() if v is not None}


def load(raw: Any) -> History | None:
    """The history from a status (None: nothing usable there, e.g. written by an older operator)."""
    if not isinstance(raw, dict):
        return None
    try:
        recs = tuple((float(x["time"]), int(x["replicas"])) for x in raw.get("recommendations") or [])
        events = tuple((float(x["time"]), int(x["change"])) for x in raw.get("scaleEvents") or [])
        forecast = tuple(float(v) for v in raw.get("forecastReplicas") or [])
        failures = int(raw.get("failures") or 0)
    except (KeyError, TypeError, ValueError):
        return None
    return History(recommendations=recs, scale_events=events, failures=failures, hot_since=_num(raw.get("hotSince")),
                   burst_at=_num(raw.get("burstTime")), last_ok=_num(raw.get("lastReadingTime")),
                   last_demand=_num(raw.get("lastDemandQPS")), last_slope=_num(raw.get("lastSlope")),
                   last_audio_s=_num(raw.get("lastAudioSeconds")), season_s=_num(raw.get("seasonSeconds")),
                   season_checked=_num(raw.get("seasonCheckedTime")), forecast=forecast,
                   forecast_step_s=_num(raw.get("forecastStepSeconds")) or 60.0,
                   undercount=max(1.0, _num(raw.get("undercount")) or 1.0), undercount_at=_num(raw.get("undercountTime")),
                   guard_ratio=_ratio(raw.get("guardLatencyRatio")))
