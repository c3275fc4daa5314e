"""Builds a checkpoint's flow and HiFT modules from a config read by `hyperyaml`, from this module's own tables.

Only the classes in the family's table (`TABLES`) are constructed, each imported from the name written here (never from the
file), with keyword arguments checked against the class's signature: numbers, strings, booleans, null,
lists and mappings of those, and nested buildable classes. Anything else is refused with one line naming
the file line, class and argument.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

from .hyperyaml import Call, ConfigError, complaint

# The model classes `convert` exports, per family: upstream's name -> (module, class) to build. CosyVoice2's are
# upstream's own (`cosyvoice-minicpmo`); no package ships CosyVoice3's, so its are the project's (dit_flow.py,
# causal_hift.py). DictConfig holds the CFM's settings.
def _upstream(*names: str) -> dict[str, tuple[str, str]]:
    return {name: tuple(name.rsplit(".", 1)) for name in names}  # type: ignore[misc]


def _own(module: str, *names: str) -> dict[str, tuple[str, str]]:
    return {name: (f"cosyvoice_server.convert.{module}", name.rsplit(".", 1)[1]) for name in names}


TABLES: dict[str, dict[str, tuple[str, str]]] = {
    "cosyvoice2": _upstream(
        "cosyvoice.flow.flow.CausalMaskedDiffWithXvec", "cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder",
        "cosyvoice.flow.flow_matching.CausalConditionalCFM", "cosyvoice.flow.decoder.CausalConditionalDecoder",
        "cosyvoice.hifigan.generator.HiFTGenerator", "cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor",
        "omegaconf.DictConfig"),
    "cosyvoice3": _own("dit_flow", "cosyvoice.flow.flow.CausalMaskedDiffWithDiT",
                       "cosyvoice.transformer.upsample_encoder.PreLookaheadLayer",
                       "cosyvoice.flow.flow_matching.CausalConditionalCFM", "cosyvoice.flow.DiT.dit.DiT")
    | _own("causal_hift", "cosyvoice.hifigan.generator.CausalHiFTGenerator",
           "cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor")
    | _upstream("omegaconf.DictConfig"),
}
_PLAIN = (int, float, str, bool, type(None))


def _value(v: Any, where: str, path: Path | str, line: int, table: dict) -> Any:
    if isinstance(v, Call):
        return build(v, path, table)
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, (list, tuple)):
        return type(v)(_value(x, where, path, line, table) for x in v)
    if isinstance(v, dict):
        return {str(k): _value(x, f"{where}.{k}", path, line, table) for k, x in v.items()}
    raise ConfigError(f"{path}:{line}: {where} is a {type(v).__name__}; expected numbers, strings, lists or classes")


def build(call: Call, path: Path | str, table: dict[str, tuple[str, str]]) -> Any:
    """The object `call` describes, if it is `!new:` of a class in `table` (a family's, from TABLES) with
    arguments that class takes."""
    if call.kind != "new" or call.target not in table:
        raise ConfigError(f"{path}:{call.line}: '!{call.kind}:{call.target}' cannot be part of the exported model "
                          f"(convert builds {', '.join(sorted(n.rsplit('.', 1)[1] for n in table))})")
    if call.args:
        raise ConfigError(f"{path}:{call.line}: !new:{call.target} takes named arguments, not a list")
    module, name = table[call.target]
    cls = getattr(importlib.import_module(module), name)
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in call.kwargs:
        if not takes_any and key not in params:
            raise ConfigError(f"{path}:{call.line}: {name} has no argument '{key}'")
    kwargs = {k: _value(v, f"{name}.{k}", path, call.line, table) for k, v in call.kwargs.items()}
    try:
        return cls(**kwargs)
    except Exception as exc:  # the constructor's own complaint about a value, kept to one line
        raise ConfigError(f"{path}:{call.line}: {name}({', '.join(kwargs)}) failed: {complaint(exc)}") from exc
