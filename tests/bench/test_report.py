"""docs/benchmarks.md's tables come from a run's results.json through bench/report.py: the verdicts
it prints must follow the numbers, not a pasted sentence."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import report

ROOT = Path(__file__).resolve().parents[2]


def point(rps: float, p50: float = 100.0, p99: float = 200.0) -> dict[str, Any]:
    return {"rps": rps, "p50_ms": p50, "p99_ms": p99, "ttfa_p50_ms": 10.0, "rtf": 0.1, "codes": {"200": 10}}


def results(server_16: float, unbatched_32: float, server_p50_1: float, peer_rps: float) -> dict[str, Any]:
    rows = {}
    for c in (1, 16, 32):
        rows[str(c)] = {"engine": point(10.0, p50=100.0), "server": point(9.5 if c != 16 else server_16,
                                                                         p50=server_p50_1 if c == 1 else 100.0),
                        "server_unbatched": point(unbatched_32 if c == 32 else 3.0),
                        "litserve": point(peer_rps, p99=300.0)}
    return {"closed_loop": rows, "open_loop": {"5.0": {**point(4.9), "codes": {"200": 40, "429": 2}}},
            "peers": {"kinds": ["litserve"], "unavailable": {}}}


def verdicts(res: dict[str, Any]) -> list[str]:
    return [line.rsplit("|", 2)[-2].strip() for line in report.targets(res).splitlines()[2:]]


def test_targets_are_judged_from_the_numbers() -> None:
    assert verdicts(results(server_16=9.5, unbatched_32=3.0, server_p50_1=104.0, peer_rps=5.0)) == ["yes"] * 4
    assert verdicts(results(server_16=8.5, unbatched_32=3.5, server_p50_1=107.0, peer_rps=12.0)) == ["**no**"] * 4


def test_tables_show_status_codes_readably() -> None:
    table = report.table(results(9.5, 3.0, 101.0, 5.0))
    assert "| 200 × 40, 429 × 2 |" in table and "{" not in table


def test_committed_results_render() -> None:
    res = json.loads((ROOT / "docs" / "bench" / "results.json").read_text())
    assert res["command"] in report.run_line(res)
    assert report.targets(res).count("\n") == 2 + 4


def voices_run(idle_p50: float, busy_p50: float, idle_p95: float, busy_p95: float) -> dict[str, Any]:
    def phase(p50: float, p95: float) -> dict[str, Any]:
        return {"requests": 100, "errors": 0, "window_s": 30.0, "ttfa_p50_ms": p50, "ttfa_p95_ms": p95, "ttfa_mean_ms": p50}

    return {"phases": {"idle": phase(idle_p50, idle_p95), "registering": phase(busy_p50, busy_p95)},
            "registrations": {"count": 10, "ok": 10, "codes": [201], "retries_on_429": 0, "p50_s": 0.5, "max_s": 0.9},
            "date": "2026-01-01", "machine": "m", "device": "cpu", "streams": 16, "voices": 10, "rounds": 1, "clip_s": 10.0,
            "command": "python -m bench.voices"}


def test_the_registration_target_is_judged_on_both_percentiles() -> None:
    def verdict(res: dict[str, Any]) -> str:
        return report.voices_table(res).strip().splitlines()[-1].rsplit("|", 2)[-2].strip()

    assert verdict(voices_run(1000, 1150, 2000, 2300)) == "yes"
    assert verdict(voices_run(1000, 1250, 2000, 2000)) == "**no**"  # the median slowed down
    assert verdict(voices_run(1000, 1000, 2000, 2500)) == "**no**"  # the tail did


def test_the_committed_registration_run_is_in_the_docs() -> None:
    res = json.loads((ROOT / "docs" / "bench" / "voices.json").read_text())
    assert report.voices_table(res) in (ROOT / "docs" / "benchmarks.md").read_text()


def test_startup_verdict_follows_the_cache_hit_over_the_miss():
    def measurement(hit_over_miss: float) -> dict[str, Any]:
        scenario = {"fetch_s": 1.0, "healthz_s": 1.0, "ready_s": 2.0, "total_to_ready_s": 3.0, "phases": {"warmup": 1.0}}
        return {"date": "2026-01-01", "machine": "m", "device": "cpu", "runs": 1, "bandwidth_mib_s": 100,
                "model": {"bytes": 2e9, "archive_bytes": 2e9}, "command": "c", "hit_over_miss": hit_over_miss,
                "scenarios": {"before": scenario, "miss": scenario, "hit": scenario | {"phases": {}}}}

    met = report.startup_section({"measurements": [measurement(0.3)]})
    assert "0.30 (target ≤ 0.33: met)" in met
    assert "| warm-up | 1.00 | 1.00 | – |" in met  # a phase the hit did not run is a dash, not a zero
    assert "not met" in report.startup_section({"measurements": [measurement(0.34)]})
