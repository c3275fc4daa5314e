"""Reading a published CosyVoice2 or CosyVoice3 checkpoint directory, with one-line errors for what is wrong.

The yaml is read as data (hyperyaml.py): every section upstream publishes is accepted, nothing in it is
imported or called, and a tag outside upstream's own classes and functions is refused.

The directory as its authors ship it: `cosyvoice2.yaml` or `cosyvoice3.yaml` (hyperpyyaml), `llm.pt`,
`flow.pt`, `hift.pt`, `campplus.onnx`, the speech tokenizer (`speech_tokenizer_v2.onnx` / `_v3.onnx`),
`CosyVoice-BlankEN/` (Qwen2 config and tokenizer), and `spk2info.pt` where the release has saved speakers. Sizes come from the yaml, the Qwen2 config
and the tensors, never from constants here. As upstream's `AutoModel`, the yaml's name says the family.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import hyperyaml


class ConvertError(Exception):
    """The checkpoint cannot be converted; the message is one line naming the file, tensor or setting."""


@dataclass(frozen=True)
class Family:
    """What tells one of upstream's model families apart in a checkpoint directory."""

    key: str  # build.TABLES key
    title: str
    yaml: str
    classes: dict[str, str]  # the yaml's llm, flow and hift classes (upstream cosyvoice/*)
    speech_tokenizer: str

    @property
    def files(self) -> tuple[str, ...]:
        return (self.yaml, "llm.pt", "flow.pt", "hift.pt", "campplus.onnx", self.speech_tokenizer,
                "CosyVoice-BlankEN/config.json")


COSYVOICE2 = Family("cosyvoice2", "CosyVoice2", "cosyvoice2.yaml",
                    {"llm": "cosyvoice.llm.llm.Qwen2LM", "flow": "cosyvoice.flow.flow.CausalMaskedDiffWithXvec",
                     "hift": "cosyvoice.hifigan.generator.HiFTGenerator"}, "speech_tokenizer_v2.onnx")
COSYVOICE3 = Family("cosyvoice3", "CosyVoice3", "cosyvoice3.yaml",
                    {"llm": "cosyvoice.llm.llm.CosyVoice3LM", "flow": "cosyvoice.flow.flow.CausalMaskedDiffWithDiT",
                     "hift": "cosyvoice.hifigan.generator.CausalHiFTGenerator"}, "speech_tokenizer_v3.onnx")
FAMILIES = (COSYVOICE2, COSYVOICE3)
OTHER_FAMILIES = {"cosyvoice.llm.llm.TransformerLM": "CosyVoice 1", "cosyvoice.flow.flow.MaskedDiffWithXvec": "CosyVoice 1"}
OTHER_YAMLS = {"cosyvoice.yaml": "CosyVoice 1"}


@dataclass(frozen=True)
class Checkpoint:
    dir: Path
    family: Family
    config: dict  # the whole yaml, references resolved, tags as hyperyaml.Call (nothing built or called)
    qwen: dict  # CosyVoice-BlankEN/config.json

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def yaml(self) -> Path:
        return self.dir / self.family.yaml


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


def _family(ckpt: Path) -> Family:
    for name, family in OTHER_YAMLS.items():
        if (ckpt / name).is_file():
            raise ConvertError(f"{ckpt / name}: a {family} checkpoint; convert takes CosyVoice2 (cosyvoice2.yaml) and "
                               "CosyVoice3 (cosyvoice3.yaml)")
    for family in FAMILIES:
        if (ckpt / family.yaml).is_file():
            return family
    raise ConvertError(f"{ckpt}: no {' or '.join(f.yaml for f in FAMILIES)} (a CosyVoice2 checkpoint has "
                       f"{', '.join(COSYVOICE2.files)}; a CosyVoice3 one the same with {COSYVOICE3.yaml} and "
                       f"{COSYVOICE3.speech_tokenizer})")


def read(ckpt: Path) -> Checkpoint:
    if not ckpt.is_dir():
        raise ConvertError(f"{ckpt}: checkpoint directory does not exist")
    family = _family(ckpt)
    for name in family.files:
        if not (ckpt / name).is_file():
            raise ConvertError(f"{ckpt / name}: missing (a {family.title} checkpoint has {', '.join(family.files)})")
    path = ckpt / family.yaml
    config = _config(path, ckpt / "CosyVoice-BlankEN")
    for key, cls in family.classes.items():
        got = _class(config, key)
        if got != cls:
            other = OTHER_FAMILIES.get(got or "") or next(
                (f.title for f in FAMILIES if f is not family and got in f.classes.values()), None)
            what = f"a {other} model ({got})" if other else (f"{got}" if got else "missing")
            raise ConvertError(f"{path}: '{key}' is {what}; {family.title} has {cls}")
    try:
        qwen = json.loads((ckpt / "CosyVoice-BlankEN/config.json").read_text())
    except ValueError as exc:
        raise ConvertError(f"{ckpt / 'CosyVoice-BlankEN/config.json'}: not valid JSON ({exc})") from exc
    if qwen.get("model_type") != "qwen2":
        raise ConvertError(f"{ckpt / 'CosyVoice-BlankEN/config.json'}: model_type is {qwen.get('model_type')!r}, expected 'qwen2'")
    return Checkpoint(ckpt, family, config, qwen)


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
