"""The server package is layered: a module imports only from its own layer or those below it, so the
protocols (api/) can change without the state, the scheduler or the engine knowing them."""

from __future__ import annotations

import ast
from pathlib import Path

import cosyvoice_server

PACKAGE = Path(cosyvoice_server.__file__).parent

# Bottom first: the first part of each module's name below cosyvoice_server ("" is the package itself).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("facts", frozenset({"", "config", "cpus", "origins", "refusals", "keys", "metrics", "startup",
                         "pronunciation"})),
    ("model and text", frozenset({"model", "frontend", "procpool", "fetch", "model_cache", "engine", "convert",
                                  "voices", "text_workers", "streaming", "streamtext", "audio", "gpu",
                                  "onnxruntime_install", "options", "lexicons", "timeline"})),
    ("scheduling", frozenset({"scheduling"})),
    ("state", frozenset({"state"})),
    ("front door", frozenset({"synthesis", "timeouts"})),
    ("protocols", frozenset({"api", "playground"})),
    ("application", frozenset({"app", "server"})),
    ("entry points", frozenset({"cli", "demo", "client"})),
)


def _layer(part: str) -> int:
    found = [i for i, (_, parts) in enumerate(LAYERS) if part in parts]
    assert found, f"cosyvoice_server.{part} is in no layer: add it to LAYERS where it belongs"
    return found[0]


def _is_module(dotted: list[str]) -> bool:
    path = PACKAGE.parent.joinpath(*dotted)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> set[str]:
    """The first part below the package of every module of the package that `path` imports (at any depth)."""
    module = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module[:-1]
    if path.name == "__init__.py":
        module = module[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = base + (node.module.split(".") if node.module else [])
            # `from . import x, y`: each a module of the package, or a name defined in its __init__
            modules = [target + [a.name] for a in node.names if _is_module(target + [a.name])]
            targets = modules + ([target] if len(modules) < len(node.names) else [])
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
        else:
            continue
        found |= {t[1] if len(t) > 1 else "" for t in targets if t[0] == PACKAGE.name}
    return found


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        own = "" if parts == ("__init__",) else parts[0]
        for target in sorted(imports(path)):
            if _layer(target) > _layer(own):
                bad.append(f"{path.relative_to(PACKAGE)} ({LAYERS[_layer(own)][0]}) imports cosyvoice_server."
                           f"{target} ({LAYERS[_layer(target)][0]})")
    return bad


def test_no_module_imports_from_a_layer_above_it() -> None:
    assert upward_imports() == []


def test_the_walk_sees_relative_imports_at_every_depth() -> None:
    # what the layer check rests on: the protocols' imports of the front door, and a state module's of the scheduler
    assert {"synthesis", "state", "refusals", "scheduling"} <= imports(PACKAGE / "api" / "speech_stream.py")
    assert "scheduling" in imports(PACKAGE / "state.py")
    assert "" in imports(PACKAGE / "app.py")  # `from . import __version__`
