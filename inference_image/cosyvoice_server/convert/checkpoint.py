"""Reading a published CosyVoice2 checkpoint directory, with one-line errors for what is wrong.

The yaml is read as data (hyperyaml.py): every section upstream publishes is accepted, nothing in it is
imported or called, and a tag outside upstream's own classes and functions is refused.

The directory as its authors ship it: `cosyvoice2.yaml` (hyperpyyaml), `llm.pt`, `flow.pt`, `hift.pt`,
`campplus.onnx`, `speech_tokenizer_v2.onnx`, `spk2info.pt`, `CosyVoice-BlankEN/` (Qwen2 config and
tokenizer). Sizes come from the yaml, the Qwen2 config and the tensors, never from constants here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import hyperyaml


class ConvertError(Exception):
    """The checkpoint cannot be converted; the message is one line naming the file, tensor or setting."""


FILES = ("cosyvoice2.yaml", "llm.pt", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2.onnx", "spk2info.pt",
         "CosyVoice-BlankEN/config.json")
# The model classes of each family's yaml (upstream cosyvoice/*): what tells a CosyVoice2 checkpoint apart.
COSYVOICE2 = {"llm": "cosyvoice.llm.llm.Qwen2LM", "flow": "cosyvoice.flow.flow.CausalMaskedDiffWithXvec",
              "hift": "cosyvoice.hifigan.generator.HiFTGenerator"}
OTHER_FAMILIES = {
    "cosyvoice.llm.llm.TransformerLM": "CosyVoice 1", "cosyvoice.flow.flow.MaskedDiffWithXvec": "CosyVoice 1",
    "cosyvoice.llm.llm.CosyVoice3LM": "CosyVoice 3", "cosyvoice.flow.flow.CausalMaskedDiffWithDiT": "CosyVoice 3",
    "cosyvoice.hifigan.generator.CausalHiFTGenerator": "CosyVoice 3",
}
OTHER_YAMLS = {"cosyvoice.yaml": "CosyVoice 1", "cosyvoice3.yaml": "CosyVoice 3"}


@dataclass(frozen=True)
class Checkpoint:
    dir: Path
    config: dict  # the whole yaml, references resolved, tags as hyperyaml.Call (nothing built or called)
    qwen: dict  # CosyVoice-BlankEN/config.json

    def path(self, name: str) -> Path:
        return self.dir / name


def _config(path: Path, blank: Path) -> dict:
    """The yaml parsed (tags as data) and resolved; a tag outside upstream's own names is refused."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConvertError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        raw = hyperyaml.parse(text, path)
        hyperyaml.check_allowed(raw, path)
        return hyperyaml.resolve(raw, {"qwen_pretrain_path": str(blank)}, path)
    except hyperyaml.ConfigError as exc:
        raise ConvertError(str(exc)) from exc


def _class(config: dict, key: str) -> str | None:
    value = config.get(key)
    return value.target if isinstance(value, hyperyaml.Call) else None


def read(ckpt: Path) -> Checkpoint:
    if not ckpt.is_dir():
        raise ConvertError(f"{ckpt}: checkpoint directory does not exist")
    if not (ckpt / "cosyvoice2.yaml").is_file():
        for name, family in OTHER_YAMLS.items():
            if (ckpt / name).is_file():
                raise ConvertError(f"{ckpt / name}: a {family} checkpoint; convert takes CosyVoice2 (cosyvoice2.yaml)")
    for name in FILES:
        if not (ckpt / name).is_file():
            raise ConvertError(f"{ckpt / name}: missing (a CosyVoice2 checkpoint has {', '.join(FILES)})")
    path = ckpt / "cosyvoice2.yaml"
    config = _config(path, ckpt / "CosyVoice-BlankEN")
    for key, cls in COSYVOICE2.items():
        got = _class(config, key)
        if got != cls:
            family = OTHER_FAMILIES.get(got or "")
            what = f"a {family} model ({got})" if family else (f"{got}" if got else "missing")
            raise ConvertError(f"{path}: '{key}' is {what}; CosyVoice2 has {cls}")
    try:
        qwen = json.loads((ckpt / "CosyVoice-BlankEN/config.json").read_text())
    except ValueError as exc:
        raise ConvertError(f"{ckpt / 'CosyVoice-BlankEN/config.json'}: not valid JSON ({exc})") from exc
    if qwen.get("model_type") != "qwen2":
        raise ConvertError(f"{ckpt / 'CosyVoice-BlankEN/config.json'}: model_type is {qwen.get('model_type')!r}, expected 'qwen2'")
    return Checkpoint(ckpt, config, qwen)


def load_state(path: Path) -> dict:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors for damaged files
        raise ConvertError(f"{path}: not a readable torch state dict ({hyperyaml.complaint(exc)})") from exc
    if not isinstance(state, dict):
        raise ConvertError(f"{path}: holds a {type(state).__name__}, expected a state dict")
    return state


def check_tensors(path: Path, state: dict, expected: dict[str, tuple[int, ...]], optional: set[str] = frozenset()) -> None:
    """One line naming the first missing, unexpected or mis-shaped tensor."""
    missing = [k for k in expected if k not in state]
    if missing:
        raise ConvertError(f"{path}: missing tensor '{missing[0]}'" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = [k for k in state if k not in expected and k not in optional]
    if extra:
        raise ConvertError(f"{path}: unexpected tensor '{extra[0]}'" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for k, shape in expected.items():
        got = tuple(state[k].shape)
        if got != tuple(shape):
            raise ConvertError(f"{path}: tensor '{k}' has shape {list(got)}, expected {list(shape)} from the config")
