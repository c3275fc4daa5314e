"""The converted miniature's pipeline and damaged checkpoints (the checkpoint, its conversion and upstream's
reference models are shared with tests/bistream: tests/conftest.py).

Needs the `convert` extra and upstream's code (`make test` installs both); without them the suite skips.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("hyperpyyaml")
pytest.importorskip("cosyvoice")


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
