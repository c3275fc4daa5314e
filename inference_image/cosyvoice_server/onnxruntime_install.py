"""Which ONNX Runtime build is installed. The server needs exactly one: every build ships the same
`onnxruntime` Python package, so two side by side overwrite each other's files and whichever was
installed last wins, often with a broken mix. The package's `cpu` and `gpu` extras each bring one.
"""

from __future__ import annotations

import re
from importlib import metadata

# the wheels that provide the `onnxruntime` package
BUILDS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino", "onnxruntime-qnn",
          "onnxruntime-rocm", "onnxruntime-training")
HOW = ("install the server with one extra: cosyvoice-server[cpu] (onnxruntime) or cosyvoice-server[gpu] "
       "(onnxruntime-gpu), e.g. pip install './inference_image[gpu]' in the repository")


def installed_builds(path: list[str] | None = None) -> list[str]:
    """The builds that share one directory of sys.path with another build are listed together (they
    overwrite each other there); otherwise the one that `import onnxruntime` finds first."""
    by_dir: dict[str, set[str]] = {}
    for d in metadata.distributions(**({"path": path} if path is not None else {})):
        name = re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower()
        if name in BUILDS:
            by_dir.setdefault(str(d.locate_file("")), set()).add(name)
    clashing = [builds for builds in by_dir.values() if len(builds) > 1]
    if clashing:
        return sorted(clashing[0])
    # builds in different directories (e.g. a --target layer over a system install): the first one imported wins
    return sorted(next(iter(by_dir.values()), set()))


def problem(builds: list[str]) -> str | None:
    """What is wrong with this set of installed builds, in words with the fix; None when there is exactly one."""
    if not builds:
        return f"no ONNX Runtime is installed; {HOW}"
    if len(builds) > 1:
        return (f"{' and '.join(builds)} are installed together; they overwrite each other's onnxruntime package. "
                f"Remove them (pip uninstall -y {' '.join(builds)}), then {HOW}")
    return None
