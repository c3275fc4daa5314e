"""Percent rate limits round like the HPA's: a fraction of a pod is a whole pod up, and a whole pod kept down."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cosyvoice_operator.autoscaling.policy import History, Metrics, Policy, Rules, Settings, decide

BASE = Settings(min_replicas=1, max_replicas=50, target_qps_per_replica=4.0, target_p95_ms=1000.0,
                scale_up=Rules(0.0, ()), scale_down=Rules(0.0, ()))


@pytest.mark.parametrize(("current", "percent", "limit"), [
    (3, 50, 5),   # 3 × 1.5 = 4.5 → 5 (HPA: ceil)
    (5, 10, 6),   # 5.5 → 6: a small percentage still allows one pod
    (7, 33, 10),  # 9.31 → 10
    (4, 50, 6),   # exact: 6
])
def test_fractional_percent_scale_up_rounds_up(current: int, percent: int, limit: int) -> None:
    s = replace(BASE, scale_up=Rules(0.0, (Policy("Percent", percent, 60.0),)))
    d = decide(1000.0, Metrics(qps=400.0, p95_ms=500.0), current=current, ready=current, policy=s, history=History())
    assert (d.desired, d.reason) == (limit, "ScaleUp"), d.message


@pytest.mark.parametrize(("current", "percent", "floor"), [
    (5, 50, 3),   # 2.5 → 3 pods kept (HPA: ceil of what may remain)
    (3, 10, 3),   # 2.7 → 3: a small percentage cannot remove a pod yet
    (10, 25, 8),  # 7.5 → 8
])
def test_fractional_percent_scale_down_keeps_the_partial_pod(current: int, percent: int, floor: int) -> None:
    s = replace(BASE, scale_down=Rules(0.0, (Policy("Percent", percent, 60.0),)))
    d = decide(1000.0, Metrics(qps=0.5, p95_ms=100.0), current=current, ready=current, policy=s, history=History())
    assert d.desired == floor, d.message
