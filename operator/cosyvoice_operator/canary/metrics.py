"""PromQL for one version of a CosyVoiceService, and the reading of its figures over one interval.

The versions share the service's series labels (``namespace``, ``cosyvoice_service``); each server says
which model it serves in its info metric ``cosyvoice_model_info{model_version="..."}`` (value 1), so a
version's series are the service's joined with that metric on ``instance`` (one scrape target, one pod):
no relabeling of every series, and the same queries work with annotation scraping and ServiceMonitors.
"""
from __future__ import annotations

from ..autoscaling import prometheus
from .analysis import Figures

INFO_METRIC = "cosyvoice_model_info"
VERSION_LABEL = "model_version"


def _of_version(expr: str, sel: str, version: str) -> str:
    """``expr`` (a vector per scrape target) kept for the targets serving ``version``."""
    info = f'{INFO_METRIC}{{{sel},{VERSION_LABEL}="{prometheus.escape(version)}"}}'
    return f"({expr}) * on (instance) group_left () max by (instance) ({info})"


def queries(namespace: str, name: str, version: str, window_s: float) -> dict[str, str]:
    """PromQL per figure of one version over the last ``window_s`` seconds."""
    sel, window = prometheus.selector(namespace, name), prometheus.duration(window_s)

    def over(metric: str, extra: str = "", fn: str = "rate") -> str:
        return _of_version(f"{fn}({metric}{{{sel}{extra}}}[{window}])", sel, version)

    def p95(metric: str, extra: str = "") -> str:
        return f"histogram_quantile(0.95, sum by (le) ({over(metric, extra)})) * 1000"

    server_error, ok = ',code=~"5.."', ',code="200"'
    return {
        "requests": f"sum({over('cosyvoice_requests_total', fn='increase')})",
        "rate": f"sum({over('cosyvoice_requests_total')})",
        "errors": f"sum({over('cosyvoice_requests_total', server_error, fn='increase')})",
        # successful requests only, as the autoscaler measures it: fast errors would pull the p95 down
        "p95_ms": p95("cosyvoice_request_duration_seconds_bucket", ok),
        "ttfa_ms": p95("cosyvoice_time_to_first_audio_seconds_bucket"),
    }


def read(query: prometheus.Query, qs: dict[str, str]) -> Figures:
    """One version's figures; raises prometheus.QueryFailed when the source cannot answer."""
    values = {key: prometheus.scalar(query(promql)) for key, promql in qs.items()}
    requests, errors = values["requests"], values["errors"]
    error_rate = None
    if requests:
        error_rate = (errors or 0.0) / requests
    elif requests == 0:
        error_rate = 0.0
    return Figures(requests=requests, p95_ms=values["p95_ms"], ttfa_ms=values["ttfa_ms"], error_rate=error_rate,
                   rate=values["rate"])
