"""The canary analysis' decision, a pure function: every path, every threshold at its boundary."""
from __future__ import annotations

import pytest
from cosyvoice_operator.canary.analysis import Figures, State, decide, failures
from cosyvoice_operator.spec import CanaryAnalysis

RULES = CanaryAnalysis(step_weights=[25, 50], max_p95_latency_ratio=1.2, max_time_to_first_audio_ratio=1.5,
                       max_error_rate=0.01, min_requests=20, failure_threshold=2)
STABLE = Figures(requests=900, p95_ms=1000, ttfa_ms=200, error_rate=0.0)
HEALTHY = Figures(requests=100, p95_ms=1100, ttfa_ms=250, error_rate=0.0)


def test_a_healthy_canary_steps_through_the_weights_then_is_promoted() -> None:
    state, seen = State(weight=10), []
    for _ in range(3):
        verdict = decide(state, STABLE, HEALTHY, RULES)
        seen.append((verdict.action, verdict.weight))
        state = State(verdict.weight, verdict.failed_checks)
    assert seen == [("step", 25), ("step", 50), ("promote", 50)]
    assert verdict.phase == "Promoted" and verdict.reason == "Promoted"


def test_a_start_weight_between_steps_goes_to_the_next_one_above() -> None:
    assert decide(State(30), STABLE, HEALTHY, RULES).weight == 50
    assert decide(State(25), STABLE, HEALTHY, RULES).weight == 50


def test_without_promotion_the_last_step_holds_for_a_person() -> None:
    rules = RULES.model_copy(update={"promote": False})
    verdict = decide(State(50), STABLE, HEALTHY, rules)
    assert (verdict.action, verdict.weight, verdict.phase) == ("hold", 50, "Holding")
    assert "removing spec.canary" in verdict.message


@pytest.mark.parametrize("canary,broken", [
    (Figures(requests=100, p95_ms=1201, ttfa_ms=200, error_rate=0.0), "p95 latency 1201 ms is 1.20× stable's 1000 ms"),
    (Figures(requests=100, p95_ms=1000, ttfa_ms=301, error_rate=0.0), "time to first audio 301 ms is 1.50×"),
    (Figures(requests=100, p95_ms=1000, ttfa_ms=200, error_rate=0.02), "error rate 2.00% > 1.00%"),
])
def test_each_threshold_fails_an_interval_just_above_it(canary: Figures, broken: str) -> None:
    verdict = decide(State(10), STABLE, canary, RULES)
    assert (verdict.action, verdict.weight, verdict.failed_checks, verdict.reason) == ("hold", 10, 1, "CheckFailed")
    assert broken in verdict.message and "1/2 failing intervals" in verdict.message


def test_exactly_at_the_thresholds_passes() -> None:
    edge = Figures(requests=20, p95_ms=1200, ttfa_ms=300, error_rate=0.01)
    assert failures(STABLE, edge, RULES) == []
    assert decide(State(10), STABLE, edge, RULES).action == "step"


def test_failing_intervals_in_a_row_abort_with_the_numbers_and_weight_zero() -> None:
    slow = Figures(requests=100, p95_ms=3000, ttfa_ms=900, error_rate=0.0)
    first = decide(State(25), STABLE, slow, RULES)
    verdict = decide(State(first.weight, first.failed_checks), STABLE, slow, RULES)
    assert (verdict.action, verdict.weight, verdict.phase) == ("abort", 0, "Aborted")
    assert "after 2 failing intervals" in verdict.message and "3000 ms is 3.00× stable's 1000 ms" in verdict.message
    assert "time to first audio 900 ms is 4.50×" in verdict.message


def test_a_passing_interval_resets_the_count_of_failures() -> None:
    assert decide(State(10, failed_checks=1), STABLE, HEALTHY, RULES).failed_checks == 0


@pytest.mark.parametrize("stable,canary,reason", [
    (STABLE, Figures(requests=19, p95_ms=9000, error_rate=0.5), "NotEnoughRequests"),
    (Figures(requests=5, p95_ms=1000), HEALTHY, "NotEnoughRequests"),
    (STABLE, Figures(), "MetricsUnavailable"),
    (Figures(), HEALTHY, "MetricsUnavailable"),
])
def test_too_little_data_holds_without_counting_a_failure(stable: Figures, canary: Figures, reason: str) -> None:
    verdict = decide(State(10, failed_checks=1), stable, canary, RULES)
    assert (verdict.action, verdict.weight, verdict.failed_checks, verdict.reason) == ("hold", 10, 1, reason)


def test_latencies_missing_on_one_side_are_not_compared() -> None:
    # every canary request failed: no successful latency, but the error rate judges it
    broken = Figures(requests=50, p95_ms=None, ttfa_ms=None, error_rate=1.0)
    assert failures(STABLE, broken, RULES) == ["error rate 100.00% > 1.00%"]
    assert failures(Figures(requests=50, p95_ms=0.0), Figures(requests=50, p95_ms=5.0), RULES) == []


def test_a_threshold_of_one_aborts_at_the_first_failure() -> None:
    rules = RULES.model_copy(update={"failure_threshold": 1})
    verdict = decide(State(10), STABLE, Figures(requests=100, p95_ms=5000, error_rate=0.0), rules)
    assert verdict.action == "abort" and "after 1 failing interval:" in verdict.message
