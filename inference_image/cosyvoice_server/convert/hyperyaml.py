"""Upstream's hyperpyyaml configs read as data: nothing in the file is imported, called or built.

Upstream publishes its training configs as the model's yaml (`cosyvoice2.yaml`, `cosyvoice3.yaml`): besides
`llm`, `flow` and `hift` they carry seeds (`!apply:torch.manual_seed [1986]`), data-pipeline functions
(`!name:cosyvoice.dataset.processor...`), GAN discriminators, flow-style lists whose `]` closes at column 0,
and `!ref <a> * <b>` arithmetic. `parse` reads all of it with a YAML safe loader into plain values and `Call`
records, `resolve` replaces references the way hyperpyyaml does, and `check_allowed` refuses any tag that
is not one of upstream's own names (`ALLOWED`). Building modules from the result is `build.py`'s job, from
its own table of classes.

    doc = resolve(parse(text, path), {"qwen_pretrain_path": "..."}, path)
    check_allowed(doc, path)
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """The yaml cannot be read or names something outside the allow-list; one line with file and line."""


MAX_COMPLAINT_CHARS = 200  # a library's own error message quoted in ours (torch's can be pages long)


def complaint(exc: BaseException) -> str:
    """A library's exception as part of one line of ours: its class and its message, whitespace folded, cut short."""
    return f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:MAX_COMPLAINT_CHARS]}"


@dataclass(frozen=True)
class Call:
    """`!new:target` (construct), `!name:target` (a partial) or `!apply:target` (a call at load time)."""

    kind: str
    target: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    line: int = 0

    def get(self, key: str, default: Any = None) -> Any:
        return self.kwargs.get(key, default)


@dataclass(frozen=True)
class Ref:
    """`!ref <a> * <b>` or `!copy <a>`, before `resolve`."""

    expr: str
    line: int


# Every name upstream's published configs (CosyVoice 1, 2 and 3) write after `!new:`, `!name:` or `!apply:`,
# with the tag kinds it appears with. Nothing here is ever imported from the file: build.py has its own table.
_SEEDS = ("random.seed", "numpy.random.seed", "torch.manual_seed", "torch.cuda.manual_seed_all")
_PROCESSOR = ("parquet_opener", "tokenize", "filter", "resample", "truncate", "compute_fbank", "compute_whisper_fbank",
              "compute_f0", "parse_embedding", "shuffle", "sort", "static_batch", "dynamic_batch", "batch", "padding")
ALLOWED: dict[str, frozenset[str]] = {
    **{name: frozenset({"apply"}) for name in _SEEDS},
    **{f"cosyvoice.dataset.processor.{fn}": frozenset({"name"}) for fn in _PROCESSOR},
    **{name: frozenset({"name"}) for name in (
        "cosyvoice.utils.common.ras_sampling", "cosyvoice.utils.common.nucleus_sampling",
        "cosyvoice.utils.common.random_sampling", "matcha.utils.audio.mel_spectrogram",
        "cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer", "cosyvoice.tokenizer.tokenizer.get_tokenizer",
        "torchaudio.functional.compute_kaldi_pitch")},
    **{name: frozenset({"new"}) for name in (
        # language models
        "cosyvoice.llm.llm.TransformerLM", "cosyvoice.llm.llm.Qwen2LM", "cosyvoice.llm.llm.Qwen2Encoder",
        "cosyvoice.llm.llm.CosyVoice3LM", "cosyvoice.transformer.encoder.ConformerEncoder",
        "cosyvoice.transformer.encoder.TransformerEncoder",
        # flows
        "cosyvoice.flow.flow.MaskedDiffWithXvec", "cosyvoice.flow.flow.CausalMaskedDiffWithXvec",
        "cosyvoice.flow.flow.CausalMaskedDiffWithDiT", "cosyvoice.flow.length_regulator.InterpolateRegulator",
        "cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder",
        "cosyvoice.transformer.upsample_encoder.PreLookaheadLayer",
        "cosyvoice.flow.flow_matching.ConditionalCFM", "cosyvoice.flow.flow_matching.CausalConditionalCFM",
        "cosyvoice.flow.decoder.ConditionalDecoder", "cosyvoice.flow.decoder.CausalConditionalDecoder",
        "cosyvoice.flow.DiT.dit.DiT", "omegaconf.DictConfig",
        # vocoders and their training wrappers
        "cosyvoice.hifigan.generator.HiFTGenerator", "cosyvoice.hifigan.generator.CausalHiFTGenerator",
        "cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor", "cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor",
        "cosyvoice.hifigan.hifigan.HiFiGan", "cosyvoice.hifigan.discriminator.MultipleDiscriminator",
        "cosyvoice.hifigan.discriminator.MultiResolutionDiscriminator",
        "cosyvoice.hifigan.discriminator.MultiResSpecDiscriminator", "matcha.hifigan.models.MultiPeriodDiscriminator")},
}
MAX_BYTES = 1 << 20  # upstream's configs are ~7 KB


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with hyperpyyaml's tags as data and YAML 1.2 floats (`1e-06` is a number in
    ruamel, which hyperpyyaml uses, and a string in YAML 1.1). Anchors and aliases are refused: upstream
    writes none, and repeated aliases would multiply the work of every walk over the result."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise ConfigError(f"line {self.peek_event().start_mark.line + 1}: YAML aliases (*name) are not allowed")
        return super().compose_node(parent, index)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def _scalar_or_items(loader: _Loader, node: yaml.Node) -> tuple[tuple, dict]:
    if isinstance(node, yaml.MappingNode):
        return (), loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return tuple(loader.construct_sequence(node, deep=True)), {}
    value = loader.construct_scalar(node)
    return ((value,) if value != "" else ()), {}


def _tagged(loader: _Loader, suffix: str, node: yaml.Node) -> Any:
    tag, line = "!" + suffix, node.start_mark.line + 1
    if tag in ("!ref", "!copy"):
        if not isinstance(node, yaml.ScalarNode):
            raise ConfigError(f"line {line}: {tag} takes a scalar like '<name>'")
        return Ref(str(loader.construct_scalar(node)), line)
    if tag == "!tuple":
        text = loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else ""
        try:
            value = ast.literal_eval(str(text))
        except (ValueError, SyntaxError):
            value = None
        if not isinstance(value, tuple):
            raise ConfigError(f"line {line}: !tuple takes a literal tuple like '(1, 2)'")
        return value
    kind, _, target = suffix.partition(":")
    if kind in ("new", "name", "apply") and target:
        args, kwargs = _scalar_or_items(loader, node)
        return Call(kind, target, args, kwargs, line)
    # hyperpyyaml's other tags (!module:, !applyref:, !include:, !PLACEHOLDER) load files or modules or call code
    raise ConfigError(f"line {line}: tag '{tag}' is not allowed (convert reads !new:, !name:, !apply:, !ref, !copy and "
                      "!tuple with upstream's own names)")


def _python_tag(loader: _Loader, suffix: str, node: yaml.Node) -> Any:
    raise ConfigError(f"line {node.start_mark.line + 1}: tag '!!python/{suffix}' is not allowed (convert never "
                      "constructs Python objects from a checkpoint)")


_Loader.add_multi_constructor("!", _tagged)
_Loader.add_multi_constructor("tag:yaml.org,2002:python/", _python_tag)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse(text: str, path: Path | str) -> dict:
    """The whole file as a mapping of plain values, `Call`s and `Ref`s."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{path}: {len(text)} bytes; a model config is at most {MAX_BYTES}")
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except ConfigError as exc:
        raise ConfigError(f"{path}:{str(exc).removeprefix('line ')}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_one_line(str(exc))}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a hyperpyyaml mapping")
    return doc


# `!ref` arithmetic, as hyperpyyaml evaluates it: numbers and + - * / // % ** with parentheses, nothing else.
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
        ast.USub: operator.neg, ast.UAdd: operator.pos}
_REF = re.compile(r"<([^<>]+)>")


def _arith(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ValueError("not arithmetic")


def _lookup(doc: dict, name: str, line: int, path: Path | str) -> Any:
    """`a`, `a.b` or `a[b]`: a top-level key and keys below it."""
    parts = [p for p in re.split(r"[.\[\]]", name) if p]
    value: Any = doc
    for i, part in enumerate(parts):
        items = value.kwargs if isinstance(value, Call) else value
        if not isinstance(items, dict) or part not in items:
            raise ConfigError(f"{path}:{line}: !ref <{name}> names nothing ('{'.'.join(parts[:i + 1])}' is not defined)")
        value = items[part]
    return value


def resolve(doc: dict, overrides: dict[str, Any], path: Path | str) -> dict:
    """References replaced by what they name (top-level keys, in file order, after `overrides`)."""
    done: dict[str, Any] = {}
    busy: set[str] = set()

    def value_of(name: str, line: int) -> Any:
        key = re.split(r"[.\[]", name, maxsplit=1)[0]
        if key not in done:
            if key in busy:
                raise ConfigError(f"{path}:{line}: !ref <{name}> refers to itself")
            if key not in doc and key not in overrides:
                raise ConfigError(f"{path}:{line}: !ref <{name}> names nothing ('{key}' is not defined)")
            busy.add(key)
            done[key] = overrides[key] if key in overrides else walk(doc[key])
            busy.discard(key)
        return _lookup(done, name, line, path)

    def ref(r: Ref) -> Any:
        names = _REF.findall(r.expr)
        if not names:
            raise ConfigError(f"{path}:{r.line}: !ref {r.expr!r} names no <key>")
        if _REF.fullmatch(r.expr.strip()):
            return value_of(names[0], r.line)
        values = {n: value_of(n, r.line) for n in names}
        text = _REF.sub(lambda m: str(values[m.group(1)]), r.expr)
        if all(type(v) in (int, float) for v in values.values()):
            try:
                return _arith(ast.parse(text.strip(), mode="eval"))
            except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
                raise ConfigError(f"{path}:{r.line}: !ref {r.expr!r} is not arithmetic on numbers ({exc})") from None
        return text  # string interpolation, e.g. '<dir>/model.pt'

    def walk(v: Any) -> Any:
        if isinstance(v, Ref):
            return ref(v)
        if isinstance(v, Call):
            return Call(v.kind, v.target, tuple(walk(a) for a in v.args), {k: walk(x) for k, x in v.kwargs.items()}, v.line)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        return v

    for key in doc:
        value_of(str(key), 0)
    return done


def calls(value: Any):
    """Every `Call` in a value, outermost first."""
    if isinstance(value, Call):
        yield value
        for v in (*value.args, *value.kwargs.values()):
            yield from calls(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from calls(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from calls(v)


def check_allowed(doc: dict, path: Path | str) -> None:
    """Refuses the first tag outside `ALLOWED` (name or kind), then any `!apply:` seed that is not one integer."""
    found = list(calls(doc))
    for call in found:
        kinds = ALLOWED.get(call.target)
        if kinds is None:
            raise ConfigError(f"{path}:{call.line}: tag '!{call.kind}:{call.target}' is not allowed (not one of "
                              "upstream CosyVoice's own classes or functions)")
        if call.kind not in kinds:
            raise ConfigError(f"{path}:{call.line}: tag '!{call.kind}:{call.target}' is not allowed "
                              f"(upstream writes it as !{'/!'.join(sorted(kinds))}:)")
    for call in found:
        if call.kind == "apply" and (call.kwargs or len(call.args) != 1 or type(call.args[0]) is not int):
            raise ConfigError(f"{path}:{call.line}: '!apply:{call.target}' takes one integer seed")
