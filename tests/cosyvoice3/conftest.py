"""CosyVoice3 against upstream's own outputs: `../shared/golden/cosyvoice3` (its README says what each array is)
holds what upstream's unmodified CosyVoice3 computed, stage by stage, on a miniature checkpoint in upstream's
layout. The tests read it in place, convert its checkpoint once per session, and skip with a one-line reason
where the data or the converter's dependencies are absent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT.parent / "shared" / "golden" / "cosyvoice3"


def need_golden() -> Path:
    if not (GOLDEN / "cases.json").is_file():
        pytest.skip(f"upstream's CosyVoice3 golden outputs are not at {GOLDEN}")
    return GOLDEN


@pytest.fixture(scope="session")
def golden() -> Path:
    return need_golden()


@pytest.fixture(scope="session")
def cases(golden) -> dict[str, dict]:
    """name -> the case's cases.json entry, with its arrays under "arrays"."""
    out = {}
    for c in json.loads((golden / "cases.json").read_text())["cases"]:
        with np.load(golden / "cases" / f"{c['name']}.npz") as z:
            out[c["name"]] = c | {"arrays": {k: z[k] for k in z.files}}
    return out


@pytest.fixture(scope="session")
def cv3_model(golden, tmp_path_factory) -> Path:
    """The golden checkpoint converted (fp32 and fp16), as `cosyvoice-server convert` writes it."""
    for module in ("torch", "transformers", "omegaconf"):
        pytest.importorskip(module)
    from cosyvoice_server.convert.convert import convert

    return convert(golden / "ckpt", tmp_path_factory.mktemp("cv3") / "cosyvoice3-mini", ["fp32", "fp16"])


@pytest.fixture(scope="session")
def cv3_verbatim(cv3_model, tmp_path_factory) -> Path:
    """The converted model with its text taken as written (upstream's text_frontend=False, as the golden runs
    were made): the model files linked, model.yaml edited."""
    out = tmp_path_factory.mktemp("cv3-verbatim") / "cosyvoice3-mini"
    out.mkdir()
    for f in cv3_model.iterdir():
        (out / f.name).symlink_to(f)
    (out / "model.yaml").unlink()
    m = yaml.safe_load((cv3_model / "model.yaml").read_text())
    m["frontend"]["text_frontend"] = False
    (out / "model.yaml").write_text(yaml.safe_dump(m, sort_keys=False, allow_unicode=True))
    return out


@pytest.fixture(scope="session")
def cv3_pipeline(cv3_verbatim):
    from cosyvoice_server.engine.pipeline import Pipeline

    return Pipeline(cv3_verbatim, "cpu", "fp32")
