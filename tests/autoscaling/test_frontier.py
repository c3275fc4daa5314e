"""HPA's and KEDA's targets swept into a frontier, and the policy placed against it: the pure functions, then
the simulator's report of them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosyvoice_operator.autoscaling.frontier import (compare, dominates, gpu_hours_at, pareto, report, scaled, sweep,
                                                     violations_at)
from cosyvoice_operator.cli import main

# HPA at three targets: the lowest target spends the most GPU-hours and violates the fewest minutes
FRONT = [(4.0, 10.0), (5.0, 4.0), (6.0, 1.0)]


def test_the_sweep_runs_from_half_to_one_and_a_half_times_the_default_target_and_includes_the_default() -> None:
    names = sweep("hpa", 11)
    assert len(names) == 11 and names[0] == "hpa@0.5" and names[-1] == "hpa@1.5" and "hpa" in names
    assert names[5] == "hpa" and names[4] == "hpa@0.9"
    assert sweep("keda", 3) == ["keda@0.5", "keda", "keda@1.5"]
    assert [scaled(n) for n in ("hpa@0.7", "keda@1.5", "hpa-arrival@1.2")] == \
        [("hpa", 0.7), ("keda", 1.5), ("hpa-arrival", 1.2)]
    assert [scaled(n) for n in ("hpa", "static@2", "hpa@x", "hpa@0", "hpa@-1")] == [None] * 5


def test_dominance_is_no_worse_on_both_and_better_on_one() -> None:
    assert dominates((4.0, 2.0), (5.0, 2.0)) and dominates((4.0, 1.0), (4.0, 2.0))
    assert not dominates((4.0, 2.0), (4.0, 2.0))  # the same point
    assert not dominates((4.0, 3.0), (5.0, 2.0)) and not dominates((5.0, 2.0), (4.0, 3.0))  # a trade


def test_the_frontier_keeps_the_points_no_other_beats_cheapest_first() -> None:
    points = [(6.0, 1.0), (4.0, 10.0), (5.5, 5.0), (5.0, 4.0), (6.5, 1.0), (4.0, 12.0)]
    assert pareto(points) == FRONT  # (5.5, 5) dearer than (5, 4) and worse; (6.5, 1) and (4, 12) too
    assert pareto([(3.0, 0.0), (4.0, 0.0), (5.0, 0.0)]) == [(3.0, 0.0)]  # more replicas buy nothing more
    assert pareto([]) == []


@pytest.mark.parametrize(("gpu", "minutes"), [(4.0, 10.0), (4.5, 7.0), (5.0, 4.0), (5.5, 2.5), (6.0, 1.0),
                                              (3.9, None), (6.1, None)])
def test_the_frontier_is_interpolated_between_targets_and_nothing_is_said_outside_it(
        gpu: float, minutes: float | None) -> None:
    assert violations_at(FRONT, gpu) == (pytest.approx(minutes) if minutes is not None else None)


def test_the_gpu_hours_hpa_needs_for_a_number_of_violating_minutes() -> None:
    assert gpu_hours_at(FRONT, 7.0) == pytest.approx(4.5)
    assert gpu_hours_at(FRONT, 12.0) == 4.0  # its cheapest target already violates fewer
    assert gpu_hours_at(FRONT, 0.5) is None  # no target violates that few
    assert gpu_hours_at([(3.0, 2.0)], 2.0) == 3.0


@pytest.mark.parametrize(("policy", "verdict", "at"), [
    ((4.5, 3.0), "better", 7.0),  # HPA tuned to 4.5 GPU-hours violates 7
    ((5.5, 3.0), "worse", 2.5),
    ((5.0, 4.0), "even", 4.0),
    ((3.5, 9.0), "better", None),  # cheaper than the cheapest target and violates fewer: dominates it
    ((3.5, 11.0), "not comparable", None),  # cheaper, but violates more than any target
    ((6.5, 1.5), "worse", None),  # dearer than the dearest target and violates more: dominated
    ((6.5, 0.5), "not comparable", None),  # dearer, and fewer violations than any target reached
])
def test_the_policy_against_the_frontier(policy: tuple[float, float], verdict: str, at: float | None) -> None:
    c = compare(policy, FRONT)
    assert c.verdict == verdict
    assert c.frontier_violating_minutes == (pytest.approx(at) if at is not None else None)
    assert c.why


def test_a_frontier_of_one_point_compares_at_its_gpu_hours_only() -> None:
    assert compare((3.0, 1.0), [(3.0, 2.0)]).verdict == "better"
    assert compare((3.0, 2.0), [(3.0, 2.0)]).verdict == "even"
    assert compare((3.5, 2.0), [(3.0, 2.0)]).verdict == "worse"
    with pytest.raises(ValueError, match="empty frontier"):
        compare((3.0, 1.0), [])


def _row(trace: str, policy: str, gpu: float, viol: float) -> dict[str, object]:
    return {"trace": trace, "policy": policy, "seeds": 3, "gpu_hours": gpu, "violating_minutes": viol}


def test_the_report_places_the_policy_per_family_against_each_swept_autoscaler() -> None:
    rows = [_row("step", "policy", 4.5, 3.0), _row("step", "hpa@0.5", 6.0, 1.0), _row("step", "hpa", 5.0, 4.0),
            _row("step", "hpa@1.5", 4.0, 10.0), _row("step", "keda", 5.0, 2.0), _row("step", "static", 9.0, 0.0),
            _row("ramp", "policy", 5.0, 1.0), _row("ramp", "hpa", 5.0, 2.0)]
    out = report(rows)
    assert len(out) == 1  # KEDA ran at one target only, ramp's HPA too: no frontier
    (step,) = out
    assert (step["trace"], step["autoscaler"], step["verdict"]) == ("step", "hpa", "better")
    assert [p["target_x"] for p in step["points"]] == [0.5, 1.0, 1.5]
    assert step["frontier"] == [[4.0, 10.0], [5.0, 4.0], [6.0, 1.0]]
    assert step["frontier_violating_minutes_at_policy_gpu_hours"] == 7.0
    assert step["frontier_gpu_hours_at_policy_violating_minutes"] == pytest.approx(5.333, abs=1e-3)


def test_the_cli_sweeps_hpa_and_keda_and_reports_the_frontier_in_json_markdown_and_plots(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["simulate", "--traces", "step", "--set", "tuning", "--seeds", "1", "--minutes", "5",
                 "--policies", "policy,hpa", "--frontier", "3", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert sorted({r["policy"] for r in data["runs"]}) == ["hpa", "hpa@0.5", "hpa@1.5", "keda", "keda@0.5",
                                                           "keda@1.5", "policy"]
    fronts = {f["autoscaler"]: f for f in data["frontiers"]}
    assert sorted(fronts) == ["hpa", "keda"]
    hpa = fronts["hpa"]["points"]
    # a lower target holds more replicas: the sweep spans a range of GPU-hours
    assert hpa[0]["target_x"] == 0.5 and hpa[0]["gpu_hours"] > hpa[-1]["gpu_hours"]
    assert fronts["hpa"]["verdict"] in ("better", "even", "worse", "not comparable")
    md = (out / "results.md").read_text()
    assert "| step | hpa@0.5 |" not in md and "| step | hpa | " in md  # the swept targets are in their own table
    assert "| step | keda | " in md.split("| verdict |")[1]
    assert (out / "frontier-step.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()


@pytest.mark.parametrize(("args", "why"), [
    (["--frontier", "3", "--policies", "hpa"], "--frontier places the policy"),
    (["--policies", "policy,hpa@zero"], "unknown policy 'hpa@zero'"),
])
def test_meaningless_frontier_flags_are_refused_with_a_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], why: str) -> None:
    (tmp_path / "load.csv").write_text("0,5\n60,6\n")
    assert main(["simulate", "--trace-file", str(tmp_path / "load.csv"), "--seeds", "1", *args]) == 2
    assert why in capsys.readouterr().err


def test_a_frontier_of_one_target_is_refused_by_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # argparse: exit status 2 and its usage line
        main(["simulate", "--frontier", "1"])
    assert "must be 0 (off) or ≥ 2 targets" in capsys.readouterr().err
