"""bench/textload.py's summary: errors count as requests but not in the percentiles, and the table puts
each of this tree's figures beside its ratio to the baseline's."""
from __future__ import annotations

import pytest

from bench.textload import WINDOWS, Short, summarize, table


def test_errors_count_as_requests_but_not_in_the_percentiles() -> None:
    rs = [Short(200, 0.0, 0.1, 0.05), Short(200, 1.0, 0.3, 0.5), Short(500, 2.0, None, 0.0)]
    s = summarize(rs)
    assert (s["requests"], s["errors"]) == (3, 1)
    assert s["ttfa_p50_ms"] == pytest.approx(200.0) and s["gap_max_ms"] == pytest.approx(500.0)


def test_the_table_gives_ratios_to_the_baseline() -> None:
    base = summarize([Short(200, 0.0, 0.2, 0.4)])
    ours = summarize([Short(200, 0.0, 0.1, 0.1)])
    res = {"windows": {w: {"baseline": base, "this tree": ours} for w in WINDOWS}}
    rows = table(res).splitlines()
    assert len(rows) == 2 + 2 * len(WINDOWS)
    assert "| quiet | this tree | 1 (0) | 100 (0.50 ×) |" in rows[3]
    assert "×" not in rows[2]  # the baseline's own row has no ratio
