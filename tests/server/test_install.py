"""Installs work as written: every `pip install` in the README and docs, the Makefile's and the image's,
resolved by pip into a clean virtualenv, brings exactly one ONNX Runtime, the one its path promises.

pip resolves against the package index (`--dry-run --report`: metadata only, nothing is installed), so
this needs the index that `make test` installs from anyway.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNTIMES = {"onnxruntime", "onnxruntime-gpu"}


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for every `pip install ...` written in the README and docs, inline or in a block."""
    found = []
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for cmd in re.findall(r"pip install [^`\n]*", line):
                found.append((f"{path.name}:{n}", cmd.split(" #")[0].strip()))
    return found


def makefile_command() -> str:
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if "install" in x and "inference_image" in x)
    return line.strip().replace("$(PIP)", "pip")


def dockerfile_command() -> str:
    text = (ROOT / "inference_image" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    run = re.search(r"^RUN (pip install [^\\&\n]*)", text, re.M).group(1)
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], run).strip()


def runtimes_installed_by(command: str, cwd: Path, python: Path, report: Path) -> set[str]:
    words = shlex.split(command)
    assert words[:2] == ["pip", "install"], command
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run", "--ignore-installed",
                    "--quiet", "--report", str(report), *words[2:]], cwd=cwd, check=True, timeout=600,
                   capture_output=True, text=True)
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    return names & RUNTIMES


def expected(command: str) -> set[str]:
    if "inference_image" not in command and "./[" not in command:
        return set()  # not the server (e.g. the operator)
    extra = re.search(r"\[(cpu|gpu)\]", command)
    assert extra, f"{command!r} installs the server without choosing its ONNX Runtime: add [cpu] or [gpu]"
    return {"cpu": {"onnxruntime"}, "gpu": {"onnxruntime-gpu"}}[extra.group(1)]


@pytest.fixture(scope="module")
def clean_python(tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("clean-venv")
    venv.create(env, with_pip=False)  # nothing installed; the outer pip resolves for this interpreter
    return env / "bin" / "python"


def test_each_install_path_brings_exactly_one_onnxruntime(clean_python, tmp_path):
    cases = [(where, cmd, ROOT, expected(cmd)) for where, cmd in documented_commands()]
    readme = set().union(*(want for where, _, _, want in cases if where.startswith("README.md:")))
    assert readme == RUNTIMES, "the README must show both the CPU and the GPU install"
    cases += [("Makefile", makefile_command(), ROOT, {"onnxruntime"}),
              ("inference_image/Dockerfile", dockerfile_command(), ROOT / "inference_image", {"onnxruntime-gpu"})]
    # (each path resolving to exactly its own runtime also shows that the base dependencies name neither)
    unique = {(cmd, cwd): i for i, (_, cmd, cwd, _) in enumerate(cases)}  # the README and Makefile share one
    with ThreadPoolExecutor(len(unique)) as pool:
        got = dict(zip(unique, pool.map(lambda k: runtimes_installed_by(k[0], k[1], clean_python, tmp_path / f"{unique[k]}.json"),
                                        unique)))
    for where, cmd, cwd, want in cases:
        runtimes = got[cmd, cwd]
        assert runtimes == want, f"{where}: `{cmd}` would install {sorted(runtimes) or 'no ONNX Runtime'}"


@pytest.mark.parametrize("builds, says", [
    ([], "no ONNX Runtime is installed"),
    (["onnxruntime", "onnxruntime-gpu"], "onnxruntime and onnxruntime-gpu are installed together"),
    (["onnxruntime-gpu"], None),
])
def test_onnxruntime_problem_says_what_to_do(builds, says):
    from cosyvoice_server.onnxruntime_install import problem

    msg = problem(builds)
    assert msg is None if says is None else (says in msg and "[cpu]" in msg and "[gpu]" in msg)


def test_builds_clash_only_in_the_same_directory(tmp_path):
    from cosyvoice_server.onnxruntime_install import installed_builds

    def dist(where: Path, name: str) -> None:
        info = where / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")

    same, layer, system = tmp_path / "site", tmp_path / "layer", tmp_path / "system"
    dist(same, "onnxruntime")
    dist(same, "onnxruntime-gpu")
    assert installed_builds([str(same)]) == ["onnxruntime", "onnxruntime-gpu"]
    dist(layer, "onnxruntime-gpu")  # e.g. pip install --target, first on PYTHONPATH, over a system install
    dist(system, "onnxruntime")
    assert installed_builds([str(layer), str(system)]) == ["onnxruntime-gpu"]
    assert installed_builds([str(tmp_path / "empty")]) == []


def test_serve_without_onnxruntime_stops_with_the_install_command():
    # the interpreter as it would be after `pip install ./inference_image` alone: no onnxruntime distribution
    hide = ("import importlib.metadata as m, sys; real = m.distributions; "
            "m.distributions = lambda **k: (d for d in real(**k) if d.metadata['Name'] != 'onnxruntime'); "
            "from cosyvoice_server.cli import main; sys.exit(main(['serve', '--port', '1']))")
    r = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "error: no ONNX Runtime is installed" in r.stderr and "[gpu]" in r.stderr and "Traceback" not in r.stderr
