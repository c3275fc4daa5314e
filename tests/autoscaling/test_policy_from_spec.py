"""Every field of spec.autoscaling reaches the policy, and what is left out takes the documented default."""
from __future__ import annotations

from cosyvoice_operator.autoscaling.policy import DEFAULT_SCALE_DOWN, DEFAULT_SCALE_UP, Policy, Rules, Settings
from cosyvoice_operator.spec import parse_spec


def settings(autoscaling: dict) -> Settings:
    spec = parse_spec({"autoscaling": autoscaling})
    assert spec.autoscaling is not None
    return Settings.from_spec(spec.autoscaling)


def test_every_field_is_carried() -> None:
    s = settings({"enabled": True, "minReplicas": 2, "maxReplicas": 9, "targetQPSPerReplica": 3.5,
                  "targetInflightPerReplica": 6, "targetP95LatencyMs": 1500, "targetTimeToFirstAudioMs": 400,
                  "tolerance": 0.2,
                  "scaleUp": {"stabilizationWindowSeconds": 30, "selectPolicy": "Min",
                              "policies": [{"type": "Pods", "value": 2, "periodSeconds": 20}]},
                  "scaleDown": {"selectPolicy": "Disabled"},
                  "fallback": {"replicas": 5, "failureThreshold": 7}})
    assert s == Settings(min_replicas=2, max_replicas=9, target_qps_per_replica=3.5, target_inflight_per_replica=6,
                         target_p95_ms=1500, target_ttfa_ms=400, tolerance=0.2,
                         scale_up=Rules(30.0, (Policy("Pods", 2, 20.0),), "Min"),
                         scale_down=Rules(DEFAULT_SCALE_DOWN.stabilization_s, DEFAULT_SCALE_DOWN.policies, "Disabled"),
                         fallback_replicas=5, failure_threshold=7)


def test_defaults_for_what_is_left_out() -> None:
    s = settings({"enabled": True, "maxReplicas": 4, "targetQPSPerReplica": 2})
    assert (s.min_replicas, s.max_replicas, s.tolerance) == (1, 4, 0.1)
    assert (s.scale_up, s.scale_down) == (DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)
    assert (s.fallback_replicas, s.failure_threshold) == (None, 3)
    assert (s.target_inflight_per_replica, s.target_p95_ms, s.target_ttfa_ms) == (None, None, None)
    assert settings({"enabled": True, "maxReplicas": 4, "targetQPSPerReplica": 2,
                     "fallback": {"replicas": 2}}).failure_threshold == 3
    # rules given without policies keep the default policies; a window of 0 is kept, not defaulted
    up = settings({"enabled": True, "maxReplicas": 4, "targetQPSPerReplica": 2,
                   "scaleUp": {"stabilizationWindowSeconds": 0}}).scale_up
    assert up == Rules(0.0, DEFAULT_SCALE_UP.policies, "Max")
    down = settings({"enabled": True, "maxReplicas": 4, "targetQPSPerReplica": 2,
                     "scaleDown": {"stabilizationWindowSeconds": 60}}).scale_down
    assert down == Rules(60.0, DEFAULT_SCALE_DOWN.policies, "Max")


def test_without_max_replicas_the_bound_is_the_minimum() -> None:
    """A disabled autoscaling block may omit maxReplicas: it then never asks for more than its minimum."""
    assert settings({"minReplicas": 3}).max_replicas == 3
    assert settings({}).max_replicas == 1
