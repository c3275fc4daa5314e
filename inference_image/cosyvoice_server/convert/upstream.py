"""Imports upstream CosyVoice2's model classes from the `cosyvoice-minicpmo` package.

The package is installed with `--no-deps`: its inference classes need torch, transformers, hyperpyyaml,
conformer, diffusers, einops, omegaconf and scipy (the `convert` extra). Two of its modules import far more
than the classes use, so this module stands in for exactly those imports before anything loads:
- `cosyvoice.utils.file_utils` imports torchaudio (audio file I/O only; PyPI has no torchaudio for every
  torch release); the model classes take `logging` from it, and `cli/model.py` (imported through
  `utils/class_utils.py`) names its TensorRT and vLLM export helpers, which conversion never calls.
- `matcha.utils` imports hydra, lightning, rich, gdown and matplotlib (training utilities); the flow
  matching class only takes a logger factory from `matcha.utils.pylogger`.
"""

from __future__ import annotations

import importlib.machinery
import logging
import sys
import types

INSTALL_HINT = (
    "the converter needs the optional 'convert' dependencies and upstream's model code: "
    "pip install 'cosyvoice-server[convert]' && pip install --no-deps cosyvoice-minicpmo==0.1.0"
)


class UpstreamMissing(ImportError):
    pass


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mod.__dict__.update(attrs)
    return mod


def _not_here(what: str):
    def fail(*_args, **_kwargs):
        raise NotImplementedError(f"upstream's {what} is not available here")
    return fail


def stub_matcha() -> None:
    """Stands in for `matcha.utils` (training utilities) before upstream's flow matching imports `matcha`."""
    if "matcha.utils.pylogger" not in sys.modules:
        try:
            import matcha  # noqa: F401  (the package, not its utils)
        except ImportError as exc:
            raise UpstreamMissing(f"{INSTALL_HINT} ({exc})") from exc
        utils = _module("matcha.utils")
        utils.__path__ = []  # a package, so `matcha.utils.pylogger` resolves to the module below
        sys.modules["matcha.utils"] = utils
        sys.modules["matcha.utils.pylogger"] = _module("matcha.utils.pylogger", get_pylogger=logging.getLogger)


def load() -> None:
    """Makes `import cosyvoice...` work for the inference classes; raises UpstreamMissing with the install hint."""
    stub_matcha()
    if "cosyvoice.utils.file_utils" not in sys.modules:
        sys.modules["cosyvoice.utils.file_utils"] = _module(
            "cosyvoice.utils.file_utils", logging=logging,
            convert_onnx_to_trt=_not_here("TensorRT export"), export_cosyvoice2_vllm=_not_here("vLLM export"))
    try:
        import cosyvoice.flow.flow  # noqa: F401
        import cosyvoice.hifigan.generator  # noqa: F401
        import cosyvoice.llm.llm  # noqa: F401
        import hyperpyyaml  # noqa: F401
    except ImportError as exc:
        raise UpstreamMissing(f"{INSTALL_HINT} ({exc})") from exc
