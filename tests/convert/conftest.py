"""One miniature upstream-layout checkpoint per session, its conversion, and upstream's reference models.

Needs the `convert` extra and upstream's code (`make test` installs both); without them the suite skips.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("hyperpyyaml")
pytest.importorskip("cosyvoice")

GREEDY = {"top_k": 1, "top_p": 0.8, "win_size": 10, "tau_r": 100.0}  # tau_r > 1: never the RAS fallback


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    from cosyvoice_server.convert.miniature import build

    return build(tmp_path_factory.mktemp("ckpt") / "CosyVoice2-mini", "mini", seed=0)


@pytest.fixture(scope="session")
def converted(checkpoint, tmp_path_factory) -> Path:
    """The converted model (fp32 and fp16), with greedy decoding so runs are comparable token for token."""
    from cosyvoice_server.convert.convert import convert

    out = convert(checkpoint, tmp_path_factory.mktemp("models") / "cosyvoice2-mini", ["fp32", "fp16"])
    m = yaml.safe_load((out / "model.yaml").read_text())
    m["llm"]["sampling"] = GREEDY
    (out / "model.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    return out


@pytest.fixture(scope="session")
def reference(checkpoint):
    from reference import Reference

    return Reference.load(checkpoint)


@pytest.fixture(scope="session")
def pipeline(converted):
    from cosyvoice_server.engine.pipeline import Pipeline

    return Pipeline(converted, "cpu", "fp32")


@pytest.fixture
def broken_checkpoint(checkpoint, tmp_path):
    """A copy of the miniature checkpoint to damage."""
    dst = tmp_path / "ckpt"
    shutil.copytree(checkpoint, dst)
    return dst
