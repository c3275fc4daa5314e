"""The simulator, its traces and its baselines on short traces (seconds of wall time): the behaviours the
full report in docs/autoscaling.md rests on."""
from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cosyvoice_operator.autoscaling import traces
from cosyvoice_operator.autoscaling.baselines import HPA, KEDA, Observation, ProjectPolicy
from cosyvoice_operator.autoscaling.policy import DEFAULT_SCALE_DOWN, Metrics, Policy, Rules, Settings
from cosyvoice_operator.autoscaling.simulate import (RunResult, SimConfig, Trace, default_settings, generated,
                                                     load_profile, make_scaler, needed_replicas, pool_bound,
                                                     service_config, simulate)
from cosyvoice_operator.cli import main
from cosyvoice_operator.spec import Batching

CFG = SimConfig(minutes=12)
PROFILE = load_profile(CFG)


def obs(current: int, ready: int, qps: float | None, error: str | None = None, growth: float = 0.0) -> Observation:
    return Observation(current, ready, Metrics(qps=qps, error=error, inflight_growth=growth))


def flat(rps: float, seconds: int, audio_s: float = CFG.audio_s) -> Trace:
    return Trace("flat", np.full(seconds, rps), np.full(seconds, audio_s))


# --- the baselines follow the documented HPA v2 / KEDA rules ---------------------------------------

@pytest.mark.parametrize(("current", "ready", "qps", "expected"), [
    (4, 4, 20.0, 8),  # ceil(4 × 5/2.5)
    (4, 4, 10.5, 4),  # ratio 1.05: within tolerance 0.1
    (4, 4, 5.0, 2),  # scale-down recommendation (before stabilization)
    (8, 4, 20.0, 8),  # 4 warming pods count as 0 on scale-up: ratio 20/(8 × 2.5) = 1.0 → no change
    (6, 4, 20.0, 8),  # missing pods at 0: ceil(20/2.5) = 8
    (8, 4, 5.0, 6),  # missing pods at 100 % of target on scale-down: (5 + 10)/(8 × 2.5) = 0.75 → 6
    (5, 4, 9.0, 5),  # scale-up without missing pods (1.1 → 0.9 ... reverses to down): no change
])
def test_hpa_replica_calculation(current: int, ready: int, qps: float, expected: int) -> None:
    assert HPA(2.5, 1, 40).recommendation(obs(current, ready, qps)) == expected


def test_hpa_fed_the_arrival_rate_sees_the_queue_the_served_rate_hides() -> None:
    saturated = obs(4, 4, 10.0, growth=10.0)  # 10 served, the backlog growing by 10/s
    assert HPA(2.5, 1, 40).recommendation(saturated) == 4
    assert HPA(2.5, 1, 40, arrival=True).recommendation(saturated) == 8


def test_hpa_scale_down_waits_300s_and_scale_up_is_rate_limited() -> None:
    hpa = HPA(2.5, 1, 40)
    assert hpa.evaluate(0.0, obs(10, 10, 25.0)) == 10
    assert [hpa.evaluate(t, obs(10, 10, 5.0)) for t in (15.0, 150.0, 299.0)] == [10, 10, 10]
    assert hpa.evaluate(301.0, obs(10, 10, 5.0)) == 2
    hpa = HPA(2.5, 1, 40)
    assert hpa.evaluate(0.0, obs(2, 2, 100.0)) == 6  # max(2 + 4 pods, 2 × 100 %) per 15 s
    assert hpa.evaluate(15.0, obs(6, 2, 100.0)) == 12  # the next period counts from 6 (missing pods as 0)


def test_missing_metrics_hold_hpa_but_keda_reads_empty_as_zero() -> None:
    hpa, keda = HPA(2.5, 1, 40), KEDA(2.5, 1, 40)
    empty = obs(10, 10, None)
    for t in range(0, 400, 15):
        current = 10 + sum(d for _, d in keda.events)
        h, k = hpa.evaluate(float(t), empty), keda.evaluate(float(t), replace(empty, current=current))
    assert h == 10
    assert k == 1  # ignoreNullValues: the empty result reads 0, the service drops to minReplicas (keda#3064)


def test_keda_fallback_only_on_query_errors() -> None:
    keda = KEDA(2.5, 1, 40, fallback_replicas=6, failure_threshold=2)
    failing = obs(3, 3, None, error="connection refused")
    assert [keda.evaluate(float(t), failing) for t in (0, 15)] == [3, 6]


# --- the simulated replica is the deployed server, as measured --------------------------------------

def test_the_simulated_replica_has_the_deployed_batch_and_queue_and_the_measured_latency() -> None:
    assert (PROFILE.max_batch_size, PROFILE.max_queue_size) == (Batching().max_batch_size, Batching().max_queue_size)
    assert (CFG.max_batch_size, CFG.max_queue_size) == (Batching().max_batch_size, Batching().max_queue_size)
    # longer requests and fuller batches take longer; a longer request leaves less rate within the SLO
    assert PROFILE.mean_latency_s(1, 4.0) < PROFILE.mean_latency_s(1, 16.0) < PROFILE.mean_latency_s(8, 16.0)
    assert PROFILE.rate_at_slo(1.0, 4.0) > 2 * PROFILE.rate_at_slo(1.0, 16.0) > 0
    assert PROFILE.p95_s(PROFILE.rate_at_slo(1.0, 12.0), 12.0) <= 1.0


def test_a_pool_sized_from_the_profile_meets_the_slo_and_one_replica_less_does_not() -> None:
    cap = PROFILE.rate_at_slo(CFG.slo_ms / 1000, CFG.audio_s)
    trace = flat(3.6 * cap, 600)
    sized = simulate(trace, make_scaler("static", CFG, trace, PROFILE), CFG, 0, PROFILE)
    assert sized.minute_attainment == 1.0 and sized.request_attainment > 0.97
    assert sized.gpu_hours == pytest.approx(4 * 600 / 3600, rel=0.02)
    short = simulate(trace, replace(make_scaler("static", CFG, trace, PROFILE), replicas=3), CFG, 0, PROFILE)
    assert short.minute_attainment < 0.5  # 120 % of what 3 replicas take within the SLO


def test_a_target_set_too_high_for_the_replica_is_corrected_by_the_latency_guardrail() -> None:
    """targetQPSPerReplica that a replica cannot serve within the objective (a number from other hardware): the
    count it gives leaves the p95 above the objective, and the guardrail adds replicas until it is met. The
    in-flight gauge of a steady load scatters around a constant: it is no backlog draining."""
    cap = PROFILE.rate_at_slo(CFG.slo_ms / 1000, CFG.audio_s)
    trace = flat(2.2 * cap, 1500)  # needs 3 replicas; the target says 2
    settings = replace(Settings(), target_qps_per_replica=1.3 * cap, target_p95_ms=CFG.slo_ms, min_replicas=1,
                       max_replicas=10, cold_start_s=CFG.cold_start_s)
    run = simulate(trace, ProjectPolicy(settings), CFG, 0, PROFILE)
    replicas, p95 = run.series["replicas"], run.series["p95_ms"]
    assert min(replicas[:10]) == 2  # what the target asks, at first
    # corrected within a few minutes, and not scaled back into the breach after the scale-down window
    assert min(replicas[10:]) == 3 and max(p95[10:]) <= CFG.slo_ms, (replicas, p95)


# --- the policy on the families ----------------------------------------------------------------------

def one(family: str, policy: str, seed: int = 0, cfg: SimConfig = CFG) -> tuple[Trace, object, object]:
    trace = next(t for t, s in generated([family], "tuning", 10, cfg) if s == seed)
    scaler = make_scaler(policy, cfg, trace, PROFILE)
    return trace, scaler, simulate(trace, scaler, cfg, seed, PROFILE)


def test_policy_does_not_flap_on_constant_poisson_traffic() -> None:
    _, _, result = one("poisson", "policy")
    assert result.reversals_per_hour == 0 and result.minute_attainment >= 0.99


def test_policy_holds_replicas_through_an_outage_where_keda_drops_them() -> None:
    trace, scaler, policy = one("outage", "policy", 1, replace(CFG, minutes=30))
    *_, keda = one("outage", "keda", 1, replace(CFG, minutes=30))
    assert policy.outage_drop == 0
    start, end = (300 + a for a in trace.outages[0])
    during = [d.desired for t, d in scaler.decisions if start + 15 <= t < end]
    assert during and during == sorted(during) and not any(d.metrics_ok for t, d in scaler.decisions
                                                           if start + 15 <= t < end)
    assert keda.outage_drop and keda.outage_drop > 0


def test_policy_pre_warms_for_a_recurring_peak_and_scales_down_in_the_trough() -> None:
    """A square wave seen twice before: replicas are up before the third peak arrives, down in between."""
    cfg = replace(CFG, minutes=30)
    unit = PROFILE.rate_at_slo(cfg.slo_ms / 1000, cfg.audio_s)
    period, lead, n = 1200, 2700, 1800
    t = np.arange(-lead, n)
    rate = unit * np.where((t % period) < period / 2, 4.0, 1.5)
    trace = Trace("square", rate, np.full(len(rate), cfg.audio_s), lead_s=lead)
    scaler = make_scaler("policy", cfg, trace, PROFILE)
    result = simulate(trace, scaler, cfg, 0, PROFILE)
    assert result.minute_attainment >= 0.95
    rises = [s for s in range(1, n) if (s % period) == 0]  # the load steps up at these scored seconds
    for rise in rises:
        before = [d.desired for at, d in scaler.decisions if 300 + lead + rise - 30 <= at < 300 + lead + rise]
        assert before and max(before) >= 4, before  # replicas for 4× are there (or warming) as the peak starts
    assert min(result.series["replicas"]) < max(result.series["replicas"])  # and not held for the peak throughout


def test_a_recurring_spike_shorter_than_the_cold_start_is_pre_warmed_from_its_third_cycle() -> None:
    """A 90 s spike to 3.5 replicas' worth every 10 minutes over 1.2 (a cron-driven client). In the spike's
    minutes the requests that finish are the short ones, so the history measures them shorter than they
    are; forecast at that length the spike was a replica short every cycle. From the third cycle (two in
    the history) it is served within the SLO."""
    cfg = replace(CFG, minutes=60)
    unit = PROFILE.rate_at_slo(cfg.slo_ms / 1000, cfg.audio_s)
    t = np.arange(3600)
    rate = unit * np.where((t + 300) % 600 < 90, 3.5, 1.2)
    trace = Trace("cron", rate, np.full(len(rate), cfg.audio_s))
    result = simulate(trace, make_scaler("policy", cfg, trace, PROFILE), cfg, 1, PROFILE)
    late = [m for m, p95 in enumerate(result.series["p95_ms"]) if p95 > cfg.slo_ms and m >= 20]
    assert late == [] and result.violating_minutes <= 4


# --- traces ---------------------------------------------------------------------------------------------

def test_a_rate_that_moves_minute_to_minute_costs_less_than_a_pool_for_its_busiest_minute() -> None:
    """An hour of a service's own traffic as Prometheus would export it: each minute's rate lognormal around
    3 replicas' worth (25 % spread), Poisson within the minute. Its 1-minute rate is far noisier than
    Poisson's, as bursty arrivals' is; sized as clumps sharing a batch it took more replicas than a fixed
    pool for its busiest minute. Sized for its busier minutes, it violates fewer minutes than HPA, for less
    than that pool."""
    cfg = SimConfig(minutes=60)
    rng = np.random.default_rng(3)
    rate = np.repeat(3 * PROFILE.rate_at_slo(cfg.slo_ms / 1000, cfg.audio_s) * rng.lognormal(0, 0.25, 60), 60)
    trace = Trace("minutes", rate, np.full(len(rate), cfg.audio_s))
    policy, hpa, static = (simulate(trace, make_scaler(p, cfg, trace, PROFILE), cfg, 1, PROFILE)
                           for p in ("policy", "hpa", "static"))
    assert policy.gpu_hours < 0.9 * static.gpu_hours and policy.violating_minutes < hpa.violating_minutes


def test_a_spike_soon_after_another_meets_the_replicas_the_first_brought() -> None:
    """Two 3-minute spikes to 3× the load, the second 4 minutes after the first ends (no pattern: once): the
    replicas started for the first are still there for the second, which violates fewer minutes than the first."""
    cfg = SimConfig(minutes=40)
    rate = np.full(50 * 60, 2 * PROFILE.rate_at_slo(cfg.slo_ms / 1000, cfg.audio_s))
    first, second = (10 + 20) * 60, (10 + 27) * 60  # scored minutes 20 and 27, after 10 minutes of history
    rate[first:first + 180] *= 3
    rate[second:second + 180] *= 3
    trace = Trace("two-spikes", rate, np.full(len(rate), cfg.audio_s), lead_s=600)
    run = simulate(trace, make_scaler("policy", cfg, trace, PROFILE), cfg, 1, PROFILE)
    replicas, p95 = np.array(run.series["replicas"]), np.array(run.series["p95_ms"])
    assert replicas[26] >= replicas[22] > replicas[19]  # held between the spikes, not let go after one minute
    assert (p95[27:31] > cfg.slo_ms).sum() < (p95[20:24] > cfg.slo_ms).sum()


@pytest.mark.parametrize("name", ["minute-noise.csv", "morning-rise.csv", "cron-spikes.csv", "busy-half-hours.csv",
                                  "random-spikes.csv"])
def test_the_example_traces_replay(name: str) -> None:
    """The traces docs/autoscaling.md replays (a service's own traffic) parse whole."""
    trace = traces.read_csv(Path(__file__).resolve().parents[2] / "examples" / "traces" / name, 12.0)
    assert trace.duration >= 4 * 3600 and trace.rate.min() > 0


def test_tuning_and_heldout_sets_do_not_share_seeds_or_parameters() -> None:
    tune, held = traces.SETS["tuning"], traces.SETS["heldout"]
    assert not set(tune.seeds) & set(held.seeds)
    assert tune.periods_min != held.periods_min and tune.step_x != held.step_x
    a = traces.generate("periodic", tune.seeds[0], tune, 10.0, 12.0, 10)
    b = traces.generate("periodic", held.seeds[0], held, 10.0, 12.0, 10)
    assert a.params != b.params and a.lead_s >= 2 * float(a.params["period_s"])


def test_trace_csv_with_header_request_lengths_and_outage(tmp_path: Path) -> None:
    path = tmp_path / "week.csv"
    path.write_text("t_seconds,rate_rps,mean_audio_s\n0,10,5\n60,20,\n120,5,20\n")
    trace = traces.read_csv(path, 12.0, [(30.0, 90.0)])
    assert trace.duration == 180 and trace.rate[59] == 10 and trace.rate[60] == 20 and trace.rate[179] == 5
    assert (trace.audio_s[0], trace.audio_s[60], trace.audio_s[120]) == (5.0, 12.0, 20.0)
    assert trace.outages == [(30.0, 90.0)]
    for bad, why in [("0,10\n0,12\n", "must increase"), ("0,-1\n", "≥ 0"), ("0,ten\n", "expected t_seconds"),
                     ("0,5,nan\n", "finite number"), ("0,5\n60,inf\n", ":2: every value must be a finite"),
                     ("0,5,12,3\n", "expected t_seconds,rate_rps\\[,mean_audio_s\\], got '0,5,12,3'")]:
        (tmp_path / "bad.csv").write_text(bad)
        with pytest.raises(ValueError, match=why):
            traces.read_csv(tmp_path / "bad.csv", 12.0)
    with pytest.raises(ValueError, match=r"--outage 200:300: starts after the trace ends \(180 s"):
        traces.read_csv(path, 12.0, [(200.0, 300.0)])
    assert traces.read_csv(path, 12.0, [(150.0, 900.0)]).outages == [(150.0, 900.0)]  # to the end


def test_cli_replays_a_csv_with_an_outage_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cap = PROFILE.rate_at_slo(1.0, 12.0)
    rows = ["t_seconds,rate_rps"] + [f"{60 * i},{cap * (2 if i < 4 else 5):.2f}" for i in range(8)]
    (tmp_path / "load.csv").write_text("\n".join(rows) + "\n")
    assert main(["simulate", "--trace-file", str(tmp_path / "load.csv"), "--outage", "120:300", "--seeds", "1",
                 "--policies", "policy,hpa,static", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in data["rows"]] == ["policy", "hpa", "static"]
    assert data["rows"][0]["outage_drop_max"] == 0 and data["verdicts"][0]["held_during_outage"]
    assert main(["simulate", "--trace-file", str(tmp_path / "load.csv"), "--outage", "300:120"]) == 2
    assert "START < END" in capsys.readouterr().err
    assert main(["simulate", "--trace-file", str(tmp_path / "missing.csv")]) == 2


def test_the_first_part_of_a_replayed_trace_can_be_history_that_is_not_scored(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A day exported from Prometheus is replayed with its first hours as the history a running service has:
    every autoscaler sees it, nobody is scored on it (a fixed pool's GPU-hours count the scored part only)."""
    cap = PROFILE.rate_at_slo(1.0, 12.0)
    (tmp_path / "load.csv").write_text("".join(f"{60 * i},{2 * cap:.2f}\n" for i in range(20)))
    common = ["simulate", "--trace-file", str(tmp_path / "load.csv"), "--seeds", "1", "--policies", "static", "--json"]
    assert main([*common, "--history", "15m"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["gpu_hours"] == pytest.approx(2 * 5 / 60)
    assert main([*common]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["gpu_hours"] == pytest.approx(2 * 20 / 60)
    assert main([*common, "--history", "20m"]) == 2
    assert "--history 20m: the trace is 1200 s long; its history must leave at least a minute" in \
        capsys.readouterr().err
    assert main(["simulate", "--traces", "step", "--history", "1h"]) == 2
    assert "--history applies to --trace-file" in capsys.readouterr().err


def test_a_csv_in_another_format_is_reported_at_its_line_not_skipped_as_headers(tmp_path: Path) -> None:
    (tmp_path / "semicolons.csv").write_text("t_seconds;rate_rps\n0;5\n60;6,5\n")
    with pytest.raises(ValueError, match=r"semicolons.csv:2: expected t_seconds,rate_rps.*separated by ';': save with "
                                         r"commas between columns and '.' as the decimal mark"):
        traces.read_csv(tmp_path / "semicolons.csv", 12.0)
    (tmp_path / "tabs.csv").write_text("0\t5\n60\t6\n")
    with pytest.raises(ValueError, match=r"tabs.csv:2: .*separated by '\\t'"):  # line 1 reads as the header
        traces.read_csv(tmp_path / "tabs.csv", 12.0)
    (tmp_path / "spaces.csv").write_text("t_seconds,rate_rps\n0 5\n")
    with pytest.raises(ValueError, match=r"spaces.csv:2: expected t_seconds,rate_rps\[,mean_audio_s\], got '0 5'$"):
        traces.read_csv(tmp_path / "spaces.csv", 12.0)
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbft_seconds,rate_rps\r\n0,5\r\n60,8\r\n")  # BOM, CRLF
    assert list(traces.read_csv(tmp_path / "excel.csv", 12.0).rate[[0, 60]]) == [5.0, 8.0]


def test_a_csv_with_dates_as_grafana_and_spreadsheets_write_them_replays_by_their_differences(
        tmp_path: Path) -> None:
    (tmp_path / "grafana.csv").write_text('"Time","sum(rate(cosyvoice_requests_total[1m]))"\n'
                                          '2026-11-25 10:00:00,5\n2026-11-25 10:01:00,8\n2026-11-25 10:03:00,2\n')
    trace = traces.read_csv(tmp_path / "grafana.csv", 12.0)
    assert trace.duration == 240 and list(trace.rate[[0, 60, 179, 180, 239]]) == [5.0, 8.0, 8.0, 2.0, 2.0]
    (tmp_path / "rfc3339.csv").write_text("2026-11-25T23:59:30Z,4,6\n2026-11-26T01:00:30+01:00,7,9\n")
    trace = traces.read_csv(tmp_path / "rfc3339.csv", 12.0)  # the offsets count: the rows are 60 s apart
    assert trace.duration == 120 and list(trace.rate[[59, 60]]) == [4.0, 7.0] and trace.audio_s[60] == 9.0
    for bad, why in [("2026-11-25 10:00:00,5\n600,5\n", r":2: expected a date and time like the first row's"),
                     ("0,5\n2026-11-25 10:00:00,5\n", r":2: expected seconds like the first row's"),
                     ("2026-11-25 10:01:00,5\n2026-11-25 10:00:00,5\n",
                      r":2: the times must increase \(2026-11-25 10:00:00 after 2026-11-25 10:01:00\)")]:
        (tmp_path / "bad.csv").write_text(bad)
        with pytest.raises(ValueError, match=why):
            traces.read_csv(tmp_path / "bad.csv", 12.0)


def test_a_trace_too_large_to_replay_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    (tmp_path / "millis.csv").write_text("0,5\n2000000,5\n")  # milliseconds read as seconds: 46 days
    with pytest.raises(ValueError, match=r"spans 46.3 days; at most 31 .*is t_seconds in seconds"):
        traces.read_csv(tmp_path / "millis.csv", 12.0)
    (tmp_path / "flood.csv").write_text("0,1e9\n60,1\n")
    with pytest.raises(ValueError, match=r"about 6e\+10 requests.*at most 5e\+07"):
        traces.read_csv(tmp_path / "flood.csv", 12.0)


@pytest.mark.parametrize(("flags", "why"), [
    (["--slo-ms", "0"], "--slo-ms must be > 0"),
    (["--max-replicas", "0"], "--max-replicas must be ≥ 1"),
    (["--min-replicas", "5", "--max-replicas", "3"], "--max-replicas (3) is below --min-replicas (5)"),
    (["--scrape-s", "45"], "must span two scrapes"),
    (["--audio-s", "-1"], "--audio-s must be > 0"),
    (["--minutes", "1e9"], "--minutes must be ≤ 44640"),
    (["--profile", "__FILE__"], "is not a profile written by bench.capacity"),
    (["--from-prometheus", "http://127.0.0.1:9", "--range", "90d"], "expected 0 < step ≤ range ≤ 31d"),
    (["--from-prometheus", "http://127.0.0.1:9", "--range", "1h"], "error: Prometheus at http://127.0.0.1:9: "),
    (["--traces", "stepp"], "unknown trace family 'stepp'; the families are step, ramp,"),
    (["--traces", "step", "--seeds", "11"], "--seeds 11: the heldout set has 10 traces per family"),
])
def test_cli_refuses_meaningless_parameters_with_a_message_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], why: str) -> None:
    (tmp_path / "load.csv").write_text("0,5\n60,6\n")
    flags = [str(tmp_path / "load.csv") if f == "__FILE__" else f for f in flags]
    source = [] if "--from-prometheus" in flags or "--traces" in flags else ["--trace-file", str(tmp_path / "load.csv")]
    seeds = [] if "--seeds" in flags else ["--seeds", "1"]
    assert main(["simulate", *source, *seeds, "--policies", "policy", *flags,
                 "--save-trace", str(tmp_path / "saved.csv")]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err
    with pytest.raises(SystemExit):  # argparse: exit status 2 and its usage line
        main(["simulate", "--trace-file", str(tmp_path / "load.csv"), "--seeds", "0"])
    assert "--seeds: must be ≥ 1" in capsys.readouterr().err


SERVICE = """apiVersion: tts.cosyvoice.dev/v1alpha1
kind: CosyVoiceService
metadata: {name: tts-canary}
spec:
  autoscaling:
    minReplicas: 2
    maxReplicas: 3
    targetP95LatencyMs: 1500
    capacityProfile: tiny-cpu
    coldStartSeconds: 60
  batching: {maxBatchSize: 4, maxQueueSize: 32}
"""


def test_a_service_manifest_is_simulated_with_its_own_policy_before_it_is_enabled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The manifest as it would be applied, autoscaling not enabled yet: its bounds, SLO, cold start and
    batching are the simulation's. Ten minutes at five replicas' worth: the manifest's policy stops at its
    maxReplicas (3), the default policy does not."""
    (tmp_path / "svc.yaml").write_text(SERVICE)
    cap = PROFILE.rate_at_slo(1.0, 12.0)
    (tmp_path / "load.csv").write_text("".join(f"{60 * i},{5 * cap:.2f}\n" for i in range(10)))
    common = ["simulate", "--trace-file", str(tmp_path / "load.csv"), "--seeds", "1", "--policies", "policy,hpa"]
    assert main([*common, "--service", str(tmp_path / "svc.yaml"), "--out", str(tmp_path / "svc")]) == 0
    err = capsys.readouterr().err
    assert "CosyVoiceService tts-canary: replicas 2–3, SLO p95 1500 ms, cold start 60 s, batch 4, queue 32" in err
    data = json.loads((tmp_path / "svc" / "results.json").read_text())
    assert (data["service"], data["config"]["slo_ms"], data["config"]["max_batch_size"]) == \
        (str(tmp_path / "svc.yaml"), 1500.0, 4)
    assert all(r["gpu_hours"] <= 3 * 10 / 60 + 1e-9 for r in data["runs"])  # HPA gets the same bounds
    assert main([*common, "--out", str(tmp_path / "default")]) == 0
    runs = json.loads((tmp_path / "default" / "results.json").read_text())["runs"]
    assert runs[0]["gpu_hours"] > 3 * 10 / 60


def test_a_service_is_read_from_standard_input_as_kubectl_prints_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`kubectl get cvs tts-canary -o yaml | cosyvoice-operator simulate --service - ...`: the stored object, with
    its status and server-side metadata."""
    stored = SERVICE.replace("metadata: {name: tts-canary}", "metadata:\n  name: tts-canary\n  namespace: speech\n"
                             "  resourceVersion: '4711'\n  managedFields: [{manager: kubectl}]") + \
        "status:\n  phase: Ready\n  replicas: 2\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(stored))
    (tmp_path / "load.csv").write_text("0,5\n60,6\n")
    assert main(["simulate", "--trace-file", str(tmp_path / "load.csv"), "--seeds", "1", "--policies", "policy",
                 "--service", "-", "--json"]) == 0
    out = capsys.readouterr()
    assert "CosyVoiceService tts-canary: replicas 2–3, SLO p95 1500 ms" in out.err
    assert json.loads(out.out)["rows"][0]["policy"] == "policy"


def test_the_documented_policy_without_prewarming_differs_from_the_default_in_those_two_levers_only() -> None:
    """docs/autoscaling.md replays the held-out set with this manifest to show what the mixed family's cost
    clause takes: the simulator's default service with the forecast off and an unwindowed scale-down."""
    path = Path(__file__).resolve().parents[2] / "docs" / "autoscaling" / "without-prewarming.yaml"
    cfg, settings, _ = service_config(path.read_text(), CFG)
    assert cfg == CFG
    assert (settings.season_lookback_s, settings.scale_down) == \
        (0.0, Rules(0.0, (Policy("Percent", 100, 60.0),), "Max"))
    assert replace(settings, season_lookback_s=Settings.season_lookback_s, scale_down=DEFAULT_SCALE_DOWN) == \
        default_settings(CFG, PROFILE)


@pytest.mark.parametrize(("text", "why"), [
    ("kind: ConfigMap\n", "--service: no CosyVoiceService (tts.cosyvoice.dev/v1alpha1) found"),
    ("spec: [unclosed\n", "--service: not YAML"),
    (SERVICE.replace("  autoscaling:", "  autoscalling:"), "autoscalling: unknown field; did you mean 'autoscaling'?"),
    (SERVICE.split("  autoscaling:")[0] + "  replicas: 2\n", "CosyVoiceService tts-canary has no spec.autoscaling"),
    (SERVICE.replace("    maxReplicas: 3\n", ""), "with autoscaling enabled: spec.autoscaling: autoscaling.maxReplicas "
                                                   "is required"),
    (SERVICE + "---\n" + SERVICE.replace("tts-canary", "tts-prod"), "holds 2 CosyVoiceServices (tts-canary, tts-prod)"),
])
def test_a_service_manifest_that_cannot_be_simulated_is_refused_with_a_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, why: str) -> None:
    (tmp_path / "svc.yaml").write_text(text)
    (tmp_path / "load.csv").write_text("0,5\n60,6\n")
    assert main(["simulate", "--trace-file", str(tmp_path / "load.csv"), "--seeds", "1",
                 "--service", str(tmp_path / "svc.yaml")]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err


def test_cli_writes_table_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["simulate", "--traces", "poisson", "--set", "tuning", "--seeds", "1", "--minutes", "5",
                 "--policies", "policy,hpa,oracle", "--out", str(out)]) == 0
    assert "| poisson | policy |" in (out / "results.md").read_text()
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["cold_start_s"] is None and len(data["runs"]) == 3 and data["set"] == "tuning"
    assert data["cold_start"] == {"hit_s": PROFILE.cold_start.hit_s, "miss_s": PROFILE.cold_start.miss_s,
                                  "source": PROFILE.cold_start.source}  # the profile's, as measured
    assert (out / "autoscaling-poisson-0.png").read_bytes()[:4] == b"\x89PNG"
    assert "runs in" in capsys.readouterr().out


def test_project_policy_uses_the_pure_decision_function() -> None:
    settings = make_scaler("policy", CFG, flat(1.0, 60), PROFILE).settings
    p = ProjectPolicy(settings)
    cap = settings.per_replica_rate(CFG.audio_s)[0]
    assert p.evaluate(0.0, Observation(4, 4, Metrics(qps=10 * cap, audio_s=CFG.audio_s))) == 10
    assert p.decisions[-1][1].reason == "ScaleUp"
    assert needed_replicas(np.array([cap]), np.array([CFG.audio_s]), CFG, PROFILE)[0] < 1.0


def test_a_run_longer_than_the_forecast_lookback_sees_only_the_lookback() -> None:
    settings = replace(make_scaler("policy", CFG, flat(1.0, 60), PROFILE).settings, season_lookback_s=600.0)
    seen: list[tuple[float, ...]] = []

    class Spy(ProjectPolicy):
        def evaluate(self, now: float, obs: Observation) -> int:
            seen.append(obs.metrics.rate_history)
            return super().evaluate(now, obs)

    simulate(flat(10.0, 1200), Spy(settings), CFG, 0, PROFILE)
    assert len(seen[-1]) == 11 and 8 < np.mean(seen[-1]) < 12  # one sample a minute over 600 s, ~10 req/s


def _run(policy: str, seed: int, gpu: float, viol: int) -> RunResult:
    return RunResult(policy, "bursty", seed, 1000, 0.9, 1 - viol / 60, viol, gpu, 0.0, 0.0, 0, None)


def test_the_pool_bound_time_shares_the_cheapest_pools_for_each_clause() -> None:
    """Two traces, HPA at 3 GPU-h and 12 violating minutes on each. Pools of 3, 4 and 5 replicas; the 4 on
    the first trace is dominated by sharing 3 and 5 (under the segment), so half HPA's minutes (12 of 24)
    are bought on the cheaper trace's hull first."""
    runs = [_run("hpa", 0, 3.0, 12), _run("hpa", 1, 3.0, 12),
            _run("static", 0, 3.0, 30), _run("static+1", 0, 4.0, 28), _run("static+2", 0, 5.0, 2),
            _run("static", 1, 3.0, 20), _run("static+1", 1, 4.0, 4), _run("static+2", 1, 5.0, 3)]
    (b,) = pool_bound(runs)
    # from 50 minutes at 6 GPU-h: trace 1's 3 → 4 buys 16 minutes for 1 GPU-h (34 left), then trace 0's
    # 3 → 5 at 28 minutes per 2 GPU-h: 22 more minutes for 22/14 GPU-h → 7 + 22/14 = 8.571 GPU-h of 6
    assert b["pool_gpu_vs_hpa_at_half_hpa_violations"] == round((7 + 22 / 14) / 6, 3)
    # at 80 % of HPA's GPU-hours (4.8) even the cheapest pools (6 GPU-h) are out of budget
    assert b["pool_violating_minutes_at_0.8_hpa_gpu"] is None
    assert b["hpa_violating_minutes"] == 12.0


def test_fixed_pools_around_the_peak_sized_one(capsys: pytest.CaptureFixture[str]) -> None:
    trace = flat(PROFILE.rate_at_slo(2.0, 12.0) * 2.5, 60)
    sizes = [make_scaler(name, CFG, trace, PROFILE).replicas for name in ("static-1", "static", "static+2")]
    assert sizes == [2, 3, 5]
    assert main(["simulate", "--traces", "poisson", "--policies", "static+x"]) == 2
    assert "unknown policy 'static+x'" in capsys.readouterr().err
