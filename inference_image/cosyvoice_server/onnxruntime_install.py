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


def installed_builds() -> list[str]:
    names = {re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() for d in metadata.distributions()}
    return sorted(names & set(BUILDS))


def problem(builds: list[str]) -> str | None:
    """What is wrong with this set of installed builds, in words with the fix; None when there is exactly one."""
    if not builds:
        return f"no ONNX Runtime is installed; {HOW}"
    if len(builds) > 1:
        return (f"{' and '.join(builds)} are installed together; they overwrite each other's onnxruntime package. "
                f"Remove them (pip uninstall -y {' '.join(builds)}), then {HOW}")
    return None
