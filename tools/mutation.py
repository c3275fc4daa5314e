"""Mutation testing of the pure decision modules with mutmut, and a per-module report.

mutmut expects the packages under ``src/`` and the tests under ``tests/`` of the directory it runs
in, so the two packages and the fast unit tests of these modules are staged in ``.mutation/``
(mtimes kept). Only the
modules in ``MODULES`` are mutated and only ``TESTS`` run. Survivors listed in
``tests/mutation-equivalents.txt`` (a mutant name and a one-line reason: the mutant behaves like
the original) are excluded from the score; every other survivor is printed with its diff.

    python -m tools.mutation [--jobs N] [--module SUBSTRING] [--function NAME] [--min-score 90]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / ".mutation"
EQUIVALENTS = ROOT / "tests" / "mutation-equivalents.txt"
PACKAGES = {"cosyvoice_server": ROOT / "inference_image" / "cosyvoice_server",
            "cosyvoice_operator": ROOT / "operator" / "cosyvoice_operator"}
# module (under src/) -> functions in scope (None: all of them)
MODULES: dict[str, tuple[str, ...] | None] = {
    "cosyvoice_server/scheduling/batching.py": None,
    "cosyvoice_server/scheduling/planning.py": None,
    "cosyvoice_server/engine/sampling.py": None,
    "cosyvoice_server/streaming.py": None,
    "cosyvoice_server/audio.py": None,
    "cosyvoice_operator/apply.py": None,
    "cosyvoice_operator/capacity.py": None,
    "cosyvoice_operator/status.py": None,
    "cosyvoice_operator/mig.py": None,
    "cosyvoice_operator/render.py": None,
    "cosyvoice_operator/autoscaling/policy.py": None,
    # what a CR author may not do: bounds, metrics-source resolution (loading the file is I/O)
    "cosyvoice_operator/admin.py": ("image_repository", "image_allowed", "check_bounds", "scheduling_problems",
                                    "resolve_source"),
    # the PromQL built per service; connecting and reading results is I/O, tested against a real Prometheus
    "cosyvoice_operator/autoscaling/prometheus.py": ("_escape", "selector", "build_queries"),
}
TESTS = [
    "tests/server/test_engine_and_scheduling.py", "tests/server/test_sampling.py", "tests/server/test_batching.py",
    "tests/server/test_planning.py",
    "tests/server/test_audio_encoding.py", "tests/server/test_speed.py", "tests/server/test_stream_resampler.py",
    "tests/operator/test_op_apply.py", "tests/operator/test_op_capacity.py", "tests/operator/test_op_status.py",
    "tests/operator/test_op_status_body.py", "tests/operator/test_op_status_conditions.py",
    "tests/operator/test_op_render.py", "tests/operator/test_op_probes.py", "tests/operator/test_op_crd.py",
    "tests/operator/test_op_validation.py", "tests/operator/test_op_owner.py", "tests/operator/test_op_render_fetch.py",
    "tests/operator/test_op_secrets_used.py", "tests/operator/test_op_voices.py", "tests/operator/test_op_voice_key.py",
    "tests/bistream/test_ws_protocol.py",
    "tests/autoscaling/test_policy.py", "tests/autoscaling/test_policy_percent.py", "tests/autoscaling/test_policy_from_spec.py",
    "tests/autoscaling/test_policy_paths.py", "tests/autoscaling/test_policy_mutants.py",
    "tests/autoscaling/test_sessions_signal.py",
    "tests/autoscaling/test_prometheus_queries.py",
    "tests/operator/test_op_admin.py", "tests/autoscaling/test_controller.py",
]
# What the staged tests read besides the packages: helpers, conftests and repository files.
TEST_SUPPORT = ["tests/conftest.py", "tests/operator/conftest.py", "tests/operator/cvs_testkit.py",
                "tests/operator/cvs_crdschema.py", "tests/operator/test_op_reconcile.py", "tests/autoscaling/conftest.py",
                "tests/bistream/conftest.py"]
REPO_FILES = ["crds", "examples", "docs", "charts"]
PYPROJECT = """\
[tool.mutmut]
source_paths = ["src"]
only_mutate = {only}
pytest_add_cli_args_test_selection = {tests}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]
also_copy = {also}

[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
"""


KILLED = ("killed", "timeout", "caught by type check")


def _sync(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` (file or tree), keeping mtimes; files that vanished are removed."""
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists() or dst.stat().st_mtime != src.stat().st_mtime or dst.stat().st_size != src.stat().st_size:
            shutil.copy2(src, dst)
        return
    wanted = {p.relative_to(src) for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    for rel in wanted:
        _sync(src / rel, dst / rel)
    if dst.exists():
        for p in dst.rglob("*"):
            if p.is_file() and p.relative_to(dst) not in wanted and "__pycache__" not in p.parts:
                p.unlink()


def stage() -> None:
    for name, path in PACKAGES.items():
        _sync(path, STAGE / "src" / name)
    for rel in TESTS + TEST_SUPPORT + REPO_FILES:
        _sync(ROOT / rel, STAGE / rel)
    config = PYPROJECT.format(only=json.dumps([f"src/{m}" for m in MODULES]), tests=json.dumps(TESTS),
                              also=json.dumps(REPO_FILES))
    pyproject = STAGE / "pyproject.toml"
    if not pyproject.exists() or pyproject.read_text() != config:
        pyproject.write_text(config)


def function_of(mutant: str) -> str:
    """The function or method a mutant changes ("pkg.mod.x_func__mutmut_3" -> func, "pkg.mod.xǁClassǁmeth__mutmut_1" -> meth)."""
    return mutant.rpartition(".")[2].split("__mutmut_")[0].removeprefix("x_").split("ǁ")[-1]


def in_scope(mutant: str, only: frozenset[str] = frozenset()) -> str | None:
    """The module a mutant belongs to if it is in scope (and, given `only`, changes one of those functions)."""
    for module, functions in MODULES.items():
        dotted = module.removesuffix(".py").replace("/", ".")
        head, _, rest = mutant.partition(dotted + ".")
        if head or not rest:
            continue
        function = function_of(mutant)
        wanted = (functions is None or function in functions) and (not only or function in only)
        return module if wanted else None
    return None


def patterns(modules: list[str], only: frozenset[str] = frozenset()) -> list[str]:
    """mutmut name patterns for the mutants in scope. Naming them makes mutmut re-test every one of
    them, so results never stand from an earlier run with other tests."""
    out = []
    for module in modules:
        dotted = module.removesuffix(".py").replace("/", ".")
        functions = MODULES[module]
        if functions is None and not only:
            out.append(f"{dotted}.*")
            continue
        names = set(functions) if functions is not None else set(only)
        names = sorted(names & only if only else names)
        out += [f"{dotted}.x_{f}__mutmut_*" for f in names] + [f"{dotted}.xǁ*ǁ{f}__mutmut_*" for f in names]
    return out


def equivalents() -> dict[str, str]:
    out = {}
    for line in EQUIVALENTS.read_text().splitlines() if EQUIVALENTS.exists() else []:
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            out[name] = reason.strip()
    return out


def results() -> dict[str, str]:
    """Mutant name -> mutmut's status, from its result files."""
    from mutmut.stats import status_by_exit_code

    out = {}
    for meta in (STAGE / "mutants" / "src").rglob("*.py.meta"):
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            out[name] = status_by_exit_code[code]
    return out


def report(min_score: float, modules: list[str], only: frozenset[str] = frozenset()) -> int:
    statuses = {m: s for m, s in results().items() if in_scope(m, only) in modules}
    known = equivalents()
    stale = sorted(set(known) - set(statuses)) if len(modules) == len(MODULES) and not only else []
    survivors: list[str] = []
    rows = []
    total = Counter[str]()
    for module in modules:
        mine = {m: s for m, s in statuses.items() if in_scope(m, only) == module}
        counts = Counter(mine.values())
        unrun_names = {m for m, s in mine.items() if s in ("not checked", "skipped")}
        equivalent = sum(1 for m in mine if m in known and m not in unrun_names)
        killed = sum(1 for m, s in mine.items() if s in KILLED and m not in known)
        unrun = len(unrun_names)
        scored = len(mine) - equivalent - unrun
        # "no tests" (no test reaches the code) and timeouts-free survivors both count against the score
        left = sorted(m for m, s in mine.items() if s not in KILLED and m not in known
                      and s not in ("not checked", "skipped"))
        survivors += left
        rows.append((module, len(mine), killed, equivalent, len(left), unrun,
                     100.0 * killed / scored if scored else 100.0))
        total.update({"mutants": len(mine), "killed": killed, "equivalent": equivalent, "scored": scored,
                      "left": len(left), "unrun": unrun})
    print(f"{'module':46} {'mutants':>7} {'killed':>6} {'equiv':>5} {'left':>4} {'unrun':>5} {'score':>6}")
    for module, n, killed, equivalent, left, unrun, score in rows:
        print(f"{module:46} {n:7} {killed:6} {equivalent:5} {left:4} {unrun:5} {score:5.1f}%")
    score = 100.0 * total["killed"] / total["scored"] if total["scored"] else 100.0
    print(f"{'all':46} {total['mutants']:7} {total['killed']:6} {total['equivalent']:5} {total['left']:4} "
          f"{total['unrun']:5} {score:5.1f}%")
    for name in survivors:
        print(f"\n--- {name}: {statuses[name]}")
        diff = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=STAGE, capture_output=True, text=True)
        print("\n".join(line for line in diff.stdout.splitlines()[1:] if line.startswith(("+", "-", "@@"))))
    if stale:
        print(f"\n{EQUIVALENTS.relative_to(ROOT)} names mutants that no longer exist: {', '.join(stale)}")
    if total["unrun"]:
        print(f"\n{total['unrun']} mutants were not run (not in the last run, or it was interrupted): the score leaves them out")
    if not total["mutants"]:
        print("\nno mutant matches the modules and functions asked for")
        return 1
    print(f"\nmutation score {score:.1f}% (equivalent mutants excluded; {total['left']} survivors listed above)")
    return 0 if score >= min_score and not stale and not total["unrun"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested in parallel")
    parser.add_argument("--module", action="append", default=[], help="only modules whose path contains this")
    parser.add_argument("--function", action="append", default=[],
                        help="only mutants of this function or method (by name) in the selected modules")
    parser.add_argument("--min-score", type=float, default=90.0)
    parser.add_argument("--report-only", action="store_true", help="report the last run's results")
    args = parser.parse_args()
    modules = [m for m in MODULES if not args.module or any(s in m for s in args.module)]
    only = frozenset(args.function)
    if not modules or not patterns(modules, only):
        parser.error("no module or function in scope matches --module/--function")
    stage()
    if not args.report_only:
        # mutmut copies the packages into mutants/ once and keeps files it finds there: start from the
        # current code every time (each run re-tests every mutant anyway)
        shutil.rmtree(STAGE / "mutants", ignore_errors=True)
        log = STAGE / "mutmut.log"
        print(f"mutmut: {len(modules)} modules, {args.jobs} at a time; progress in {log.relative_to(ROOT)}", flush=True)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        with log.open("w") as out:
            run = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(args.jobs),
                                  *patterns(modules, only)], cwd=STAGE, env=env, stdout=out, stderr=subprocess.STDOUT)
        if run.returncode != 0:
            print(log.read_text()[-3000:], f"\nmutmut run failed with exit code {run.returncode}", file=sys.stderr)
            return run.returncode
    return report(args.min_score, modules, only)


if __name__ == "__main__":
    sys.exit(main())
