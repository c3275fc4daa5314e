"""The inference server's settings, as the operator knows them: a table generated from the server's
``Settings`` (``python -m tools.sync_chart`` writes ``server_settings.json``; a test keeps it current),
and the facts of its metrics the operator computes with (``server_metrics.json``, likewise).

The operator image does not contain the server package, so it reads the table instead of importing
it. Everything the operator says about a server setting — the ``COSYVOICE_*`` names it renders, the
defaults and bounds of the CRD's ``batching`` and ``shutdown`` fields, the simulator's queue — comes
from here.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from pydantic import Field

TABLE_FILE = "server_settings.json"
METRICS_FILE = "server_metrics.json"


@cache
def table() -> dict[str, dict[str, Any]]:
    rows = json.loads(resources.files(__package__).joinpath(TABLE_FILE).read_text())
    return {row["name"]: row for row in rows}


@cache
def metrics() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(METRICS_FILE).read_text())


def latency_buckets() -> tuple[float, ...]:
    """The upper bounds of the server's latency histograms (request duration, time to first audio)."""
    return tuple(metrics()["latency_buckets_s"])


def setting(name: str) -> dict[str, Any]:
    try:
        return table()[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a cosyvoice-server setting") from None


def env(name: str) -> str:
    """``COSYVOICE_<NAME>`` of a setting; a KeyError for a name the server does not have."""
    return str(setting(name)["env"])


def default(name: str) -> Any:
    return setting(name)["default"]


def env_names() -> frozenset[str]:
    return frozenset(row["env"] for row in table().values())


@dataclass(frozen=True)
class CrField:
    """A CosyVoiceService field that sets one server setting."""
    path: tuple[str, ...]  # under spec, camelCase as in the CRD
    setting: str
    # Whole numbers only, where the operator does arithmetic on the value (terminationGracePeriodSeconds).
    integer: bool = False

    def schema(self) -> dict[str, Any]:
        """The CRD property: the server's default and bounds (rounded inwards for an integer field)."""
        row = setting(self.setting)
        kind = "integer" if self.integer or row["type"] == "integer" else "number"
        out: dict[str, Any] = {"type": kind}
        if kind == "integer":
            out["format"] = "int32"
        default_value = row["default"]
        out["default"] = int(default_value) if kind == "integer" else default_value
        if "minimum" in row:
            out["minimum"] = math.ceil(row["minimum"]) if kind == "integer" else row["minimum"]
        elif "exclusiveMinimum" in row:
            if kind == "integer":
                out["minimum"] = math.floor(row["exclusiveMinimum"]) + 1
            else:
                out["minimum"], out["exclusiveMinimum"] = row["exclusiveMinimum"], True
        if "maximum" in row:
            out["maximum"] = math.floor(row["maximum"]) if kind == "integer" else row["maximum"]
        return out

    def field(self) -> Any:
        """A pydantic ``Field`` with the same default and bounds as ``schema()``."""
        s = self.schema()
        bounds: dict[str, Any] = {}
        if "minimum" in s:
            bounds["gt" if s.get("exclusiveMinimum") else "ge"] = s["minimum"]
        if "maximum" in s:
            bounds["le"] = s["maximum"]
        return Field(default=s["default"], **bounds)


# The CR fields that are server settings. Adding one: a row here, the field in spec.py and the CRD
# (tests check the CRD against schema() and that render passes the value on).
CR_FIELDS: tuple[CrField, ...] = (
    CrField(("batching", "maxBatchSize"), "max_batch_size"),
    CrField(("batching", "maxQueueDelayMs"), "max_queue_delay_ms"),
    CrField(("batching", "maxQueueSize"), "max_queue_size"),
    CrField(("batching", "requestTimeoutSeconds"), "request_timeout_s", integer=True),
    CrField(("shutdown", "drainTimeoutSeconds"), "drain_timeout_s", integer=True),
)


def cr_field(*path: str) -> CrField:
    return next(f for f in CR_FIELDS if f.path == path)
