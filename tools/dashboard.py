"""The Grafana dashboard shipped by the chart, as code (``python -m tools.sync_chart`` writes the JSON).

Series come from the chart's PodMonitor (label ``cosyvoice_service`` = the CosyVoiceService name),
kube-state-metrics (Deployment replicas) and its custom-resource-state config for CosyVoiceServices
(``cosyvoice_service_*``, desired replicas of the autoscaler). ``$__rate_interval``, ``$namespace``
and ``$service`` are Grafana variables.
"""
from __future__ import annotations

from typing import Any

UID = "cosyvoice-tts"
SEL = 'namespace=~"$namespace", cosyvoice_service=~"$service"'
BY = "namespace, cosyvoice_service"
RATE = "$__rate_interval"


def _quantile(q: float, metric: str, extra: str = "", by: str = BY) -> str:
    sel = SEL + (f", {extra}" if extra else "")
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{sel}}}[{RATE}])))"


def _per_version(expr: str, by: str) -> str:
    """`expr` (per scrape target) summed per model version: joined with the server's cosyvoice_model_info on
    `instance`, the canary analysis's join."""
    info = f"max by (instance, model_version) (cosyvoice_model_info{{{SEL}}})"
    return f"sum by ({by}) (({expr}) * on (instance) group_left (model_version) {info})"


# (title, unit, [(legend, expr)], description)
PANELS: list[tuple[str, str, list[tuple[str, str]], str]] = [
    ("Request latency (successful)", "s",
     [(f"p{int(q * 100)} {{{{cosyvoice_service}}}}", _quantile(q, "cosyvoice_request_duration_seconds", 'code="200"'))
      for q in (0.5, 0.95, 0.99)],
     "Accept → last byte of 200 answers, per service."),
    ("Time to first audio", "s",
     [(f"p{int(q * 100)} {{{{cosyvoice_service}}}}", _quantile(q, "cosyvoice_time_to_first_audio_seconds"))
      for q in (0.5, 0.95)],
     "Accept → first audio samples (what a streaming listener waits for)."),
    ("Requests per second by code", "reqps",
     [("{{cosyvoice_service}} {{code}}",
       f"sum by ({BY}, code) (rate(cosyvoice_requests_total{{{SEL}}}[{RATE}]))")],
     "429 = queue full, 503 = not ready or draining, 504 = request deadline."),
    ("Mean batch size per stage", "short",
     [("{{cosyvoice_service}} {{stage}}",
       f"sum by ({BY}, stage) (rate(cosyvoice_batch_size_sum{{{SEL}}}[{RATE}])) / "
       f"sum by ({BY}, stage) (rate(cosyvoice_batch_size_count{{{SEL}}}[{RATE}]))")],
     "Sequences per LLM step, chunks per flow/vocoder run; compare with the configured max batch size."),
    ("Queue depth per stage", "short",
     [("{{cosyvoice_service}} {{stage}}", f"sum by ({BY}, stage) (cosyvoice_queue_depth{{{SEL}}})"),
      ("{{cosyvoice_service}} in flight / capacity",
       f"sum by ({BY}) (cosyvoice_inflight_requests{{{SEL}}}) / sum by ({BY}) (cosyvoice_admission_capacity{{{SEL}}})")],
     "Work waiting per stage, and admitted requests as a share of admission capacity (1 = 429s next)."),
    ("Queue wait p95 per stage", "s",
     [("{{cosyvoice_service}} {{stage}}", _quantile(0.95, "cosyvoice_queue_wait_seconds", by=f"{BY}, stage"))],
     "Time work waited before its batch ran."),
    ("Real-time factor (compute s per audio s)", "short",
     [("{{cosyvoice_service}}",
       f"sum by ({BY}) (rate(cosyvoice_stage_compute_seconds_sum{{{SEL}}}[{RATE}])) / "
       f"sum by ({BY}) (rate(cosyvoice_audio_seconds_total{{{SEL}}}[{RATE}]))")],
     "Batch compute time of all stages per second of audio produced (< 1 keeps up with playback)."),
    ("Speech sessions (WebSocket)", "short",
     [("{{cosyvoice_service}} open", f"sum by ({BY}) (cosyvoice_stream_sessions_open{{{SEL}}})"),
      ("{{cosyvoice_service}} waiting for text", f"sum by ({BY}) (cosyvoice_stream_parked_sessions{{{SEL}}})"),
      ("{{cosyvoice_service}} ended {{reason}} /s",
       f"sum by ({BY}, reason) (rate(cosyvoice_stream_sessions_total{{{SEL}}}[{RATE}]))")],
     "Open sessions (targetSessionsPerReplica scales on them), those parked waiting for text, and why sessions end."),
    ("Streamed text: first audio and lag", "s",
     [(f"text → first audio p{int(q * 100)} {{{{cosyvoice_service}}}}",
       _quantile(q, "cosyvoice_stream_text_to_first_audio_seconds")) for q in (0.5, 0.95)]
     + [("flush → last audio p95 {{cosyvoice_service}}", _quantile(0.95, "cosyvoice_stream_audio_lag_seconds"))],
     "A session's first text to its first audio, and how far a segment's audio trails its last text."),
    ("Replicas: desired vs ready", "short",
     [("{{deployment}} desired",
       'sum by (namespace, deployment) (kube_deployment_spec_replicas{namespace=~"$namespace", deployment=~"$service"})'),
      ("{{deployment}} ready",
       'sum by (namespace, deployment) '
       '(kube_deployment_status_replicas_ready{namespace=~"$namespace", deployment=~"$service"})'),
      ("{{name}} autoscaler desired",
       'max by (namespace, name) (cosyvoice_service_autoscaling_desired_replicas{namespace=~"$namespace", '
       'name=~"$service"})')],
     "kube-state-metrics; the autoscaler line needs the chart's kube-state-metrics config."),
    ("GPU utilization", "percentunit",
     [("{{pod}} {{gpu_uuid}}", f"max by ({BY}, pod, gpu_uuid) (cosyvoice_gpu_utilization_ratio{{{SEL}}})")],
     "Whole GPUs only: NVML reports no utilization per MIG device."),
    ("GPU memory used per device (MIG slice or GPU)", "percentunit",
     [("{{pod}} {{mig_profile}} {{mig_uuid}}{{gpu_uuid}}",
       f"max by ({BY}, pod, gpu_uuid, mig_uuid, mig_profile) (cosyvoice_gpu_memory_used_bytes{{{SEL}}}) / "
       f"max by ({BY}, pod, gpu_uuid, mig_uuid, mig_profile) (cosyvoice_gpu_memory_total_bytes{{{SEL}}})")],
     "Used / total memory of the device each pod holds."),
    ("Per model version: p95 latency and error ratio (canaries)", "short",
     [("p95 s {{cosyvoice_service}} {{model_version}}",
       "histogram_quantile(0.95, " + _per_version(
           f'rate(cosyvoice_request_duration_seconds_bucket{{{SEL}, code="200"}}[{RATE}])', f"{BY}, model_version, le")
       + ")"),
      ("5xx ratio {{cosyvoice_service}} {{model_version}}",
       _per_version(f'rate(cosyvoice_requests_total{{{SEL}, code=~"5.."}}[{RATE}])', f"{BY}, model_version") + " / "
       + _per_version(f"rate(cosyvoice_requests_total{{{SEL}}}[{RATE}])", f"{BY}, model_version"))],
     "Stable and canary side by side (spec.modelVersion; unset, a digest of what defines the model)."),
    ("Ready pods", "short",
     [("{{cosyvoice_service}}", f"sum by ({BY}) (cosyvoice_ready{{{SEL}}})")],
     "Pods answering /readyz."),
]


def _panel(index: int, title: str, unit: str, targets: list[tuple[str, str]], description: str) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                    for i, (legend, expr) in enumerate(targets)],
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "includeAll": True,
            "multi": True, "current": {"text": "All", "value": "$__all"}, "allValue": ".*", "sort": 1}


def build() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": "CosyVoice TTS",
        "description": "CosyVoice inference servers managed by the CosyVoice operator.",
        "tags": ["cosyvoice", "tts", "gpu"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            _variable("namespace", "Namespace", "label_values(cosyvoice_ready, namespace)"),
            _variable("service", "Service", 'label_values(cosyvoice_ready{namespace=~"$namespace"}, cosyvoice_service)'),
        ]},
        "panels": [_panel(i, *p) for i, p in enumerate(PANELS)],
    }


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression in a dashboard (panels' targets)."""
    return [t["expr"] for panel in dashboard.get("panels", []) for t in panel.get("targets", [])]
