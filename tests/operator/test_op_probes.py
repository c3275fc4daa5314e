"""The probes' time budgets: a slow first model load is not killed, a wedged process is."""
from __future__ import annotations

import re
from typing import Any

from cosyvoice_operator import render as r
from cosyvoice_operator.spec import parse_spec
from cvs_testkit import ROOT

Obj = dict[str, Any]


def probes(spec: Obj) -> Obj:
    return r.server_container(parse_spec(spec))


def budget_s(probe: Obj) -> int:
    """Seconds of consecutive failures before the kubelet acts on a probe."""
    return int(probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"])


def documented_minutes() -> int:
    text = (ROOT / "docs" / "operator.md").read_text()
    match = re.search(r"startup probe allows (\d+) minutes", text)
    assert match, "docs/operator.md states the startup probe's model-load budget"
    return int(match.group(1))


def test_startup_probe_gives_the_first_model_load_the_documented_budget() -> None:
    c = probes({})
    startup, liveness = c["startupProbe"], c["livenessProbe"]
    # Loading and warming a model from a network volume on a cold node takes minutes; a shorter
    # budget restarts the pod in a loop before it ever serves.
    assert budget_s(startup) == documented_minutes() * 60 == 600
    assert startup["timeoutSeconds"] < startup["periodSeconds"]
    # Once started, liveness reacts within a minute to a wedged process.
    assert budget_s(liveness) <= 60 < budget_s(startup)
    assert budget_s(c["readinessProbe"]) <= 15  # a draining or overloaded pod leaves the endpoints fast


def test_every_probe_is_timed_as_the_docs_state() -> None:
    """docs/operator.md states each probe's period, failure count and answer timeout; the pod uses those."""
    text = " ".join((ROOT / "docs" / "operator.md").read_text().split())
    stated = {
        "startupProbe": re.search(r"startup probe allows (\d+) minutes \((\d+) × (\d+) s\)", text),
        "livenessProbe": re.search(r"liveness restarts a process that stops answering for (\d+) s \((\d+) × (\d+) s\)", text),
        "readinessProbe": re.search(r"readiness takes a pod out of the endpoints after (\d+) s \((\d+) × (\d+) s\)", text),
    }
    timeouts = re.search(r"A check waits (\d+) s for an answer \(liveness (\d+) s\)", text)
    assert all(stated.values()) and timeouts, "docs/operator.md states the probes' timing"
    c = probes({})
    for name, match in stated.items():
        total, failures, period = map(int, match.groups())
        assert total * (60 if name == "startupProbe" else 1) == failures * period, name  # the docs add up
        timeout = int(timeouts.group(2 if name == "livenessProbe" else 1))
        assert (c[name]["failureThreshold"], c[name]["periodSeconds"], c[name]["timeoutSeconds"]) == (
            failures, period, timeout), name
