"""The ``cosyvoice-operator`` console script: ``render`` without a cluster, ``run`` argument handling."""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cosyvoice_operator import cli
from cvs_testkit import EXAMPLES_DIR


def run_cli(args: list[str], monkeypatch: pytest.MonkeyPatch, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(args)
    return code, out.getvalue(), err.getvalue()


def test_render_prints_the_children_as_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run_cli(["render", "-f", str(EXAMPLES_DIR / "mig-single.yaml")], monkeypatch)
    assert code == 0 and err == ""
    docs = list(yaml.safe_load_all(out))
    assert [(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in docs] == [
        ("Service", "tts-a100", "speech"), ("Deployment", "tts-a100", "speech"),
        ("PodDisruptionBudget", "tts-a100", "speech")]
    assert "&id" not in out  # no YAML anchors: kubectl users read this
    pod = docs[1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb"


def test_render_reads_stdin_skips_other_documents_and_prints_json(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n---\n" + (EXAMPLES_DIR / "cpu-laptop.yaml").read_text()
    code, out, _ = run_cli(["render", "-f", "-", "-o", "json", "-n", "dev"], monkeypatch, stdin=stream)
    assert code == 0
    listed = json.loads(out)
    assert listed["kind"] == "List"
    assert [i["kind"] for i in listed["items"]] == ["Service", "Deployment"]  # the example disables its PDB
    assert {i["metadata"]["namespace"] for i in listed["items"]} == {"dev"}


@pytest.mark.parametrize("text,message", [
    ("apiVersion: tts.cosyvoice.dev/v1alpha1\nkind: CosyVoiceService\nmetadata: {name: x}\n"
     "spec: {gpu: {migStrategy: single, migProfile: 1g.5gb}}\n",
     "CosyVoiceService x: spec.gpu: gpu.product is required"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", "no CosyVoiceService"),
    ("apiVersion: tts.cosyvoice.dev/v1alpha1\nkind: CosyVoiceService\nmetadata: {name: Bad_Name}\n", "DNS-1035"),
    ("kind: CosyVoiceService\nspec: [unclosed\n", "cr.yaml is not YAML: "),
    (None, "No such file or directory"),
])
def test_render_rejects_invalid_input_with_a_readable_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             text: str | None, message: str) -> None:
    path = tmp_path / "cr.yaml"
    if text is not None:
        path.write_text(text)
    code, out, err = run_cli(["render", "-f", str(path)], monkeypatch)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and message in err


def test_run_needs_a_scope() -> None:
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["run"])
    args = parser.parse_args(["run", "-n", "a", "-n", "b", "--liveness", "http://0.0.0.0:8080/healthz"])
    assert args.namespace == ["a", "b"] and args.resync_seconds == 60.0 and args.leader_elect is False
    assert parser.parse_args(["run", "-A"]).all_namespaces is True


def test_console_script_is_declared_and_render_needs_no_kopf() -> None:
    """`render` must work on a laptop with nothing but the package: no cluster, no kopf import."""
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "cosyvoice-operator"]
    assert script.value == "cosyvoice_operator.cli:main"
    code = ("import sys\nfrom cosyvoice_operator.cli import main\nrc = main(['render', '-f', sys.argv[1]])\n"
            "assert 'kopf' not in sys.modules, 'kopf was imported'\nsys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(EXAMPLES_DIR / "minimal.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kinds: list[Any] = [d["kind"] for d in yaml.safe_load_all(done.stdout)]
    assert kinds == ["Service", "Deployment", "PodDisruptionBudget"]


def test_kopf_settings_bound_every_watch() -> None:
    import kopf
    from cosyvoice_operator.handlers import configure

    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.watching.server_timeout and settings.watching.client_timeout
    assert settings.watching.client_timeout > settings.watching.server_timeout
    assert settings.watching.connect_timeout and settings.networking.request_timeout
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)


def test_run_refuses_a_bad_configuration_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "operator.yaml"
    bad.write_text("bounds: {maxReplicas: -1}\n")
    code, out, err = run_cli(["run", "-A", "--config", str(bad)], monkeypatch)
    assert code == 2 and err.startswith("error: invalid operator configuration") and "maxReplicas" in err
    code, out, err = run_cli(["run", "-A", "--leader-elect", "--renew-deadline", "20"], monkeypatch)
    assert code == 2 and "renew deadline < lease duration" in err


def test_every_flag_of_every_command_says_what_it_does_and_the_simulator_shows_its_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per flag
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        silent = [a.option_strings[-1] for a in command._actions if a.option_strings and not a.help]
        assert not silent, f"{name}: flags without help: {silent}"
    text = sub.choices["simulate"].format_help()
    assert "(default 15.0)" in text and "(default 40)" in text and "(default tiny-cpu)" in text
    assert "default: the profile's measured start" in text and "(default None)" not in text
