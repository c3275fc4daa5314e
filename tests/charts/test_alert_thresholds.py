"""Alert thresholds and durations are the ones docs/operations.md states: the chart's defaults, the
rendered rules, and promtool evaluating the rules just below and just above each documented threshold."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from chartkit import OPERATOR_CHART, ROOT, Obj, of_kind, promtool

DOC_DURATION = re.compile(r"for (\d+) minutes|`\w+For` \((\d+)m\)")
# "`errorRatio` (5 %)", "`p95LatencySeconds` (5 s)", "`timeToFirstAudioSeconds`, 1 s"
DOC_THRESHOLD = re.compile(r"`(\w+)`[ ,(]+(\d+(?:\.\d+)?) ?(%|s\b)")


def runbooks() -> dict[str, str]:
    """Alert name -> the text of its runbook section."""
    text = (ROOT / "docs" / "operations.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^### (CosyVoice\w+)\n(.*?)(?=^#|\Z)", text, re.M | re.S)}


def documented(section: str) -> tuple[str, dict[str, float]]:
    """The documented `for` duration and the named thresholds (ratios as fractions, seconds as seconds)."""
    match = DOC_DURATION.search(section)
    assert match, f"no duration stated in: {section[:80]}"
    thresholds = {key: float(value) / (100 if unit == "%" else 1) for key, value, unit in DOC_THRESHOLD.findall(section)}
    return f"{match.group(1) or match.group(2)}m", thresholds


@pytest.fixture(scope="module")
def rules(rendered: dict[str, list[Obj]]) -> dict[str, Obj]:
    (rule,) = of_kind(rendered["monitoring-with-api"], "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


def test_every_alert_fires_after_the_documented_duration_at_the_documented_threshold(rules: dict[str, Obj]) -> None:
    docs = runbooks()
    defaults = yaml.safe_load((OPERATOR_CHART / "values.yaml").read_text())["monitoring"]["prometheusRule"]
    assert set(rules) <= set(docs), f"alerts without a runbook: {set(rules) - set(docs)}"
    checked = 0
    for name, rule in rules.items():
        duration, thresholds = documented(docs[name])
        assert rule["for"] == duration, f"{name}: rule waits {rule['for']}, docs say {duration}"
        for key, value in thresholds.items():
            assert float(defaults[key]) == value, f"{name}: values.yaml {key}={defaults[key]}, docs say {value}"
            compared = [float(x) for x in re.findall(r">\s*([\d.]+)(?![\d.]*[a-z])", rule["expr"])]
            assert value in compared, f"{name}: the rule compares against {compared}, docs say {key} = {value}"
            checked += 1
    assert checked >= 6  # latency, first audio, errors, rejections, saturation, GPU memory


# --- promtool: quiet just below each ratio threshold, firing just above it after the duration ----------

def _series(name: str, labels: str, values: str) -> Obj:
    return {"series": f"{name}{{{labels}}}", "values": values}


def _ratio_inputs(alert: str, service: str, ratio: float) -> list[Obj]:
    """Series that put `alert`'s ratio at `ratio` for `service` from minute 0 on."""
    svc = f'namespace="default", cosyvoice_service="{service}"'
    if alert in ("CosyVoiceHighErrorRatio", "CosyVoiceRequestsRejected"):
        code = "500" if alert == "CosyVoiceHighErrorRatio" else "429"
        bad = round(ratio * 1000)
        return [_series("cosyvoice_requests_total", f'{svc}, code="{code}"', f"0+{bad}x60"),
                _series("cosyvoice_requests_total", f'{svc}, code="200"', f"0+{1000 - bad}x60")]
    if alert == "CosyVoiceQueueSaturated":
        return [_series("cosyvoice_inflight_requests", svc, f"{round(ratio * 1000)}x60"),
                _series("cosyvoice_admission_capacity", svc, "1000x60")]
    gpu = f'{svc}, pod="{service}-0", gpu_uuid="GPU-1", mig_uuid="MIG-1", mig_profile="1g.10gb"'
    return [_series("cosyvoice_gpu_memory_used_bytes", gpu, f"{round(ratio * 1000)}x60"),
            _series("cosyvoice_gpu_memory_total_bytes", gpu, "1000x60")]


def test_the_error_alert_names_the_model_version_that_fails(rules: dict[str, Obj], tmp_path: Path) -> None:
    """A canary answering 10 % 5xx beside a healthy stable version: the alert fires for the canary's version only."""
    rule = {k: v for k, v in rules["CosyVoiceHighErrorRatio"].items() if k != "annotations"}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
    svc = 'namespace="default", cosyvoice_service="tts"'
    series = []
    for pod, version, bad in (("tts-0", "cv2", 0), ("tts-1", "cv2", 0), ("tts-canary-0", "cv3", 100)):
        at = f'{svc}, instance="{pod}:8000"'
        series += [_series("cosyvoice_requests_total", f'{at}, code="500"', f"0+{bad}x60"),
                   _series("cosyvoice_requests_total", f'{at}, code="200"', f"0+{1000 - bad}x60"),
                   _series("cosyvoice_model_info", f'{at}, model="m", model_version="{version}"', "1x60")]
    labels = {"severity": rule["labels"]["severity"], "namespace": "default", "cosyvoice_service": "tts",
              "model_version": "cv3"}
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [{"eval_time": "10m", "alertname": "CosyVoiceHighErrorRatio", "exp_alerts": [{"exp_labels": labels}]}],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run([str(promtool()), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


RATIO_ALERTS = {"CosyVoiceHighErrorRatio": "errorRatio", "CosyVoiceRequestsRejected": "rejectedRatio",
                "CosyVoiceQueueSaturated": "saturationRatio", "CosyVoiceGPUMemoryNearLimit": "gpuMemoryRatio"}


@pytest.mark.parametrize("alert", sorted(RATIO_ALERTS))
def test_ratio_alert_boundaries(rules: dict[str, Obj], alert: str, tmp_path: Path) -> None:
    duration, thresholds = documented(runbooks()[alert])
    threshold, minutes = thresholds[RATIO_ALERTS[alert]], int(duration.removesuffix("m"))
    rule = {k: v for k, v in rules[alert].items() if k != "annotations"}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
    labels = {"severity": rule["labels"]["severity"], "namespace": "default", "cosyvoice_service": "above"}
    if alert == "CosyVoiceGPUMemoryNearLimit":
        labels |= {"pod": "above-0", "gpu_uuid": "GPU-1", "mig_uuid": "MIG-1", "mig_profile": "1g.10gb"}
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": _ratio_inputs(alert, "above", threshold + 0.01) + _ratio_inputs(alert, "below", threshold - 0.01),
        "alert_rule_test": [
            {"eval_time": f"{minutes - 1}m", "alertname": alert, "exp_alerts": []},  # still pending
            {"eval_time": f"{minutes + 3}m", "alertname": alert, "exp_alerts": [{"exp_labels": labels}]},
        ],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run([str(promtool()), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
