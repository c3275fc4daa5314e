"""Open WebSocket speech sessions as an autoscaling signal: spec.autoscaling.targetSessionsPerReplica,
its PromQL, the decision and the simulator's row."""
from __future__ import annotations

from typing import Any

import pytest

from cosyvoice_operator.autoscaling.policy import Metrics, Rules, Settings, decide, History
from cosyvoice_operator.autoscaling.prometheus import build_queries, read
from cosyvoice_operator.autoscaling.simconfig import SimConfig
from cosyvoice_operator.autoscaling.simulate import load_profile, make_scaler, simulate
from cosyvoice_operator.autoscaling import traces
from cosyvoice_operator.spec import InvalidSpec, parse_spec

SESSIONS_ONLY = Settings(min_replicas=1, max_replicas=20, target_sessions_per_replica=8.0,
                         scale_up=Rules(0.0, ()), scale_down=Rules(0.0, ()))


@pytest.mark.parametrize(("sessions", "current", "desired", "reason"), [
    (40.0, 2, 5, "ScaleUp"),  # 40 open sessions / 8 per replica
    (8.0, 4, 1, "ScaleDown"),
    (36.0, 4, 5, "ScaleUp"),  # 4.5: 12.5 % over, beyond the tolerance; rounded up
    (34.0, 4, 4, "WithinTolerance"),  # 4.25: within 10 %
])
def test_open_sessions_size_the_replicas(sessions, current, desired, reason) -> None:
    d = decide(0.0, Metrics(qps=1.0, inflight=sessions, sessions=sessions), current=current, ready=current,
               policy=SESSIONS_ONLY, history=History())
    assert (d.desired, d.reason) == (desired, reason)
    if reason != "WithinTolerance":
        assert "sessions" in d.message


def test_the_larger_count_wins_when_requests_and_sessions_are_both_targets() -> None:
    both = Settings(min_replicas=1, max_replicas=20, target_qps_per_replica=4.0, target_sessions_per_replica=8.0,
                    scale_up=Rules(0.0, ()), scale_down=Rules(0.0, ()))
    by_rate = decide(0.0, Metrics(qps=40.0, sessions=8.0), current=2, ready=2, policy=both, history=History())
    by_sessions = decide(0.0, Metrics(qps=4.0, sessions=80.0), current=2, ready=2, policy=both, history=History())
    assert (by_rate.desired, by_sessions.desired) == (10, 10)


def test_crd_field_alone_is_a_target_and_reaches_the_policy() -> None:
    spec = parse_spec({"autoscaling": {"enabled": True, "maxReplicas": 8, "targetSessionsPerReplica": 12}})
    assert Settings.from_spec(spec.autoscaling).target_sessions_per_replica == 12
    with pytest.raises(InvalidSpec, match="targetSessionsPerReplica"):
        parse_spec({"autoscaling": {"enabled": True, "maxReplicas": 8}})
    with pytest.raises(InvalidSpec):
        parse_spec({"autoscaling": {"targetSessionsPerReplica": 0}})


def _vec(value: str) -> list[dict[str, Any]]:
    return [{"metric": {}, "value": [0, value]}]


def test_the_sessions_query_is_scoped_overridable_and_read() -> None:
    queries = build_queries("speech", "agents")
    assert queries["sessions"] == ('sum(cosyvoice_stream_sessions_open{namespace="speech",'
                                   'cosyvoice_service="agents"})')
    spec = parse_spec({"autoscaling": {"queries": {"sessions": "sum(my_sessions{$selector})"}}})
    custom = build_queries("speech", "agents", spec.autoscaling.queries)
    assert custom["sessions"] == 'sum(my_sessions{namespace="speech",cosyvoice_service="agents"})'
    by_query = {queries["qps"]: _vec("2"), queries["inflight"]: _vec("30"), queries["sessions"]: _vec("27")}
    reading = read(lambda promql: by_query.get(promql, []), queries)
    assert reading.metrics.error is None and reading.metrics.sessions == 27.0


def test_simulator_row_sessions_policy_holds_the_slo_on_a_ramp() -> None:
    cfg = SimConfig(minutes=20)
    prof = load_profile(cfg)
    unit = prof.rate_at_slo(cfg.slo_ms / 1000, cfg.audio_s)
    trace = traces.generate("ramp", traces.SETS["heldout"].seeds[0], traces.SETS["heldout"], unit, cfg.audio_s,
                            cfg.minutes)
    scaler = make_scaler("sessions", cfg, trace, prof)
    assert scaler.name == "sessions" and scaler.settings.target_sessions_per_replica > 0
    result = simulate(trace, scaler, cfg, 0, prof)
    assert result.policy == "sessions"
    assert result.minute_attainment >= 0.9
    assert max(result.series["replicas"]) > min(result.series["replicas"])  # it followed the ramp
