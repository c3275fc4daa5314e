"""Schemathesis against the server's own OpenAPI document: generated valid and invalid requests for every
operation must never get a 5xx. Bounded (examples per operation, one fuzzing pass, a short audio cap)
so it stays well under a minute on a small machine; the seed makes a failure reproducible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

KEY = "fuzz-key"
MAX_EXAMPLES = 30
SEED = 20261202


def test_no_generated_request_gets_a_server_error(start_server, tmp_path):
    # A short audio cap keeps every accepted synthesis fast; longer inputs then get their 400.
    s = start_server("--max-audio-seconds", "4", env={"COSYVOICE_API_KEY": KEY})
    auth = {"Authorization": f"Bearer {KEY}"}
    schema = httpx.get(s.url + "/openapi.json", headers=auth, timeout=10)
    assert schema.status_code == 200
    path = tmp_path / "openapi.json"
    path.write_text(json.dumps(_with_served_models(schema.json(), ["tts-1", "cosyvoice2-tiny"])))
    st = Path(sys.executable).with_name("schemathesis")
    # One worker: hypothesis describes its filters with ast.parse, which two threads at once can break on
    # CPython 3.11 ("SystemError: AST constructor recursion depth mismatch", a failure of the tool's run).
    cmd = [str(st), "run", str(path), "--url", s.url, "--checks", "not_a_server_error", "--max-examples",
           str(MAX_EXAMPLES), "--seed", str(SEED), "--header", f"Authorization: Bearer {KEY}",
           "--request-timeout", "30", "--workers", "1", "--no-color"]
    env = os.environ | {"SCHEMATHESIS_HOOKS": ""}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "Traceback" not in s.log() and "internal_error" not in r.stdout
    # the run really exercised the speech operation, with bodies accepted and bodies refused
    metrics = s.metrics()
    assert 'cosyvoice_requests_total{code="200"}' in metrics, "no generated request was synthesized"
    assert 'cosyvoice_requests_total{code="400"}' in metrics


def _with_served_models(doc: dict, models: list[str]) -> dict:
    """Random model names only reach the 404 branch; pinning them to served names lets the generated
    bodies get through to synthesis (the other fields stay free)."""
    def walk(node):
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and {"model", "input"} <= props.keys():
                props["model"] = {"type": "string", "enum": models}
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(doc)
    return doc
