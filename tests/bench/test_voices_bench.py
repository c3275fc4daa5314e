"""bench/voices.py's comparison: requests are counted in the window they started in, pairs are matched
whatever their order, and the gaps between windows count in neither phase."""
from __future__ import annotations

import pytest

from bench.loadgen import Result
from bench.voices import summarize


def req(start: float, ttfa: float, code: int = 200) -> Result:
    return Result(code, ttfa + 1.0, ttfa, 1.0, start)


def test_pairs_in_either_order_and_the_gaps_count_nowhere() -> None:
    # round 0: registering then idle; round 1: idle then registering (the bench alternates)
    windows = [("registering", 0.0, 10.0), ("idle", 11.0, 21.0), ("idle", 22.0, 32.0), ("registering", 33.0, 43.0)]
    results = ([req(t, 0.4) for t in (1, 2, 3)] + [req(t, 0.2) for t in (12, 13, 14)]  # round 0: 2x slower
               + [req(t, 0.3) for t in (23, 24, 25)] + [req(t, 0.3) for t in (34, 35, 36)]  # round 1: even
               + [req(10.5, 9.0), req(21.5, 9.0), req(43.5, 9.0)]  # in the gaps and after: never counted
               + [req(5.0, 0.4, code=503)])  # an error counts as a request, not a TTFA
    res = summarize(results, windows)
    busy, idle = res["phases"]["registering"], res["phases"]["idle"]
    assert (busy["requests"], busy["errors"], idle["requests"], idle["errors"]) == (7, 1, 6, 0)
    assert busy["window_s"] == idle["window_s"] == 20.0
    assert res["p50_ratio_per_round"] == pytest.approx([2.0, 1.0])
    assert busy["ttfa_p50_ms"] == pytest.approx(350.0) and idle["ttfa_p50_ms"] == pytest.approx(250.0)
    lo, hi = res["p50_ratio_interval_90"]
    assert 1.0 <= lo <= hi <= 2.0
