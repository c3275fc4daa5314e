"""The cold start is the capacity profile's measured one, a cache hit and a cache miss: the policy forecasts
that far ahead, and the simulator pays a miss on a node new to the model and a hit on one that ran a replica."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

from cosyvoice_operator.autoscaling import profile as profiles
from cosyvoice_operator.autoscaling.baselines import Observation
from cosyvoice_operator.autoscaling.policy import RATE_WINDOW_S, Settings
from cosyvoice_operator.autoscaling.simulate import SimConfig, Trace, default_settings, load_profile, simulate
from cosyvoice_operator.spec import parse_spec

CFG = SimConfig(minutes=12)
PROFILE = load_profile(CFG)
CACHED = replace(PROFILE, cold_start=profiles.ColdStart(20.0, 90.0, "test"))  # a hit, a miss


@dataclass
class Scripted:
    """Replicas by the clock (from ``plan``), recording how many were ready at each evaluation."""
    plan: list[tuple[float, int]]
    interval: float = 5.0
    name: str = "scripted"
    ready: list[tuple[float, int]] = field(default_factory=list)

    def evaluate(self, now: float, obs: Observation) -> int:
        self.ready.append((now, obs.ready))
        return [n for t, n in self.plan if t <= now][-1]


def ready_at(scaler: Scripted, count: int, after: float) -> float:
    return next(t for t, n in scaler.ready if t >= after and n >= count)


def test_the_first_start_on_a_node_misses_the_cache_and_a_later_one_there_hits() -> None:
    """1 replica from the start (what the load needs); up to 3 at 400 s (two nodes new to the model: misses),
    down to 1 at 600 s (the nodes stay, their cache too), up to 3 at 800 s (hits), and to 4 at 1000 s (a new
    node: a miss)."""
    warm = 300  # the simulator's warm-up before the trace
    plan = [(0.0, 1), (warm + 400.0, 3), (warm + 600.0, 1), (warm + 800.0, 3), (warm + 1000.0, 4)]
    trace = Trace("flat", np.full(1200, 1.0), np.full(1200, CFG.audio_s))
    scaler = Scripted(plan)
    run = simulate(trace, scaler, CFG, 0, CACHED)
    assert scaler.ready[0] == (warm, 1)
    assert (run.starts, run.cache_misses) == (5, 3)
    assert ready_at(scaler, 3, warm + 400) == pytest.approx(warm + 400 + 90, abs=5)
    assert ready_at(scaler, 3, warm + 800) == pytest.approx(warm + 800 + 20, abs=5)
    assert ready_at(scaler, 4, warm + 1000) == pytest.approx(warm + 1000 + 90, abs=5)


def test_a_start_given_on_the_command_line_is_every_start() -> None:
    warm = 300
    plan = [(0.0, 1), (warm + 400.0, 3), (warm + 600.0, 1), (warm + 800.0, 3)]
    trace = Trace("flat", np.full(1000, 1.0), np.full(1000, CFG.audio_s))
    scaler = Scripted(plan)
    simulate(trace, scaler, replace(CFG, cold_start_s=45.0), 0, CACHED)
    assert ready_at(scaler, 3, warm + 400) == pytest.approx(warm + 400 + 45, abs=5)
    assert ready_at(scaler, 3, warm + 800) == pytest.approx(warm + 800 + 45, abs=5)


def test_the_policy_forecasts_a_cache_miss_ahead_as_the_profile_measured_it() -> None:
    s = Settings(profile=CACHED, target_p95_ms=2000)
    assert s.start_s == 90.0 and s.horizon_s == 90.0 + RATE_WINDOW_S + s.interval_s
    assert replace(s, cold_start_s=30.0).start_s == 30.0  # coldStartSeconds, when set, wins
    assert Settings().start_s == profiles.ASSUMED_COLD_START_S  # no profile: the assumption
    assert default_settings(CFG, CACHED).start_s == 90.0  # the simulated policy reads the simulated replica's
    spec = {"autoscaling": {"enabled": True, "maxReplicas": 4, "targetP95LatencyMs": 2000,
                            "capacityProfile": "tiny-cpu"}}
    auto = parse_spec(spec).autoscaling
    assert auto is not None and auto.cold_start_seconds is None
    assert Settings.from_spec(auto, CACHED).start_s == 90.0
    assert Settings.from_spec(auto, PROFILE).start_s == PROFILE.cold_start.miss_s


def test_the_bundled_profile_carries_its_cold_start_once() -> None:
    raw = json.loads((profiles.PROFILES / "tiny-cpu.json").read_text())
    start = PROFILE.cold_start
    assert (start.hit_s, start.miss_s) == (raw["cold_start"]["cache_hit_s"], raw["cold_start"]["cache_miss_s"])
    assert 0 < start.hit_s <= start.miss_s


def test_a_profile_without_a_cold_start_assumes_one_and_a_hit_slower_than_a_miss_is_refused(tmp_path: Path) -> None:
    raw = json.loads((profiles.PROFILES / "tiny-cpu.json").read_text())
    del raw["cold_start"]
    (tmp_path / "plain.json").write_text(json.dumps(raw))
    assert profiles.load(str(tmp_path / "plain.json")).cold_start == profiles.ASSUMED
    raw["cold_start"] = {"cache_hit_s": 100, "cache_miss_s": 30}
    (tmp_path / "wrong.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="cold_start needs 0 ≤ cache_hit_s ≤ cache_miss_s, got 100 and 30"):
        profiles.load(str(tmp_path / "wrong.json"))
