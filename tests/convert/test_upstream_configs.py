"""Checkpoints whose yaml is upstream's published config (every section), and hostile configs that must
neither run nor convert.

The configs come from `upstream_yaml`, which writes upstream's `examples/libritts/cosyvoice{2,3}/conf/*.yaml`
in upstream's own layout (seeds, data pipeline with its `]` at column 0, GAN discriminators, training
settings) with sizes as parameters.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from test_convert_errors import _one_line_error, convert_cli  # noqa: F401  (fixture)
from reference import Reference
from test_parity import TOL, _chunk, report

from cosyvoice_server.convert import hyperyaml, upstream_yaml
from cosyvoice_server.convert.checkpoint import ConvertError, read


@pytest.mark.parametrize("family", ["cosyvoice2", "cosyvoice2-earlier", "cosyvoice3"])
def test_upstream_configs_read_whole_as_data(family):
    text = (upstream_yaml.cosyvoice3() if family == "cosyvoice3"
            else upstream_yaml.cosyvoice2(streaming_params=not family.endswith("earlier")))
    lines = text.splitlines()
    assert "]" in lines and any(line.startswith("__set_seed3: !apply:torch.manual_seed") for line in lines)
    raw = hyperyaml.parse(text, "x.yaml")
    hyperyaml.check_allowed(raw, "x.yaml")
    doc = hyperyaml.resolve(raw, {"qwen_pretrain_path": "/blank"}, "x.yaml")
    cfm = doc["flow"].kwargs["decoder"].kwargs
    assert cfm["estimator"].kwargs["static_chunk_size"] == 50  # `!ref <a> * <b>` arithmetic
    assert cfm["cfm_params"].kwargs["content"]["sigma_min"] == 1e-06  # a number, as in YAML 1.2
    assert doc["hifigan"].kwargs["generator"] is doc["hift"]
    assert doc["get_tokenizer"].kwargs["token_path"] == "/blank"
    assert [c.target.rsplit(".", 1)[1] for c in doc["data_pipeline"]][:3] == ["parquet_opener", "tokenize", "filter"]
    assert doc["train_conf"]["optim_conf"]["lr"] == 1e-5


MARKER = "cosyvoice-hostile-marker"


def _hostile(marker) -> dict[str, tuple]:
    """name -> (edit of the yaml text, words the one-line error must contain)."""
    run = f"!apply:os.system ['touch {marker}']"
    return {
        "apply inside flow": (lambda t: t.replace("    only_mask_loss: True", f"    only_mask_loss: {run}"),
                              ("!apply:os.system", "not allowed")),
        "apply at top level": (lambda t: t + f"\nboom: {run}\n", ("!apply:os.system",)),
        "apply in the data pipeline": (lambda t: t.replace("    !ref <padding>,", f"    !ref <padding>,\n    {run},"),
                                       ("!apply:os.system",)),
        "apply in the training settings": (lambda t: t.replace("    grad_clip: 5", f"    grad_clip: {run}", 1),
                                           ("!apply:os.system",)),
        "seed that calls": (lambda t: t.replace("!apply:random.seed [1986]", f"!apply:random.seed [{run}]"),
                            ("!apply:os.system",)),
        "unknown class": (lambda t: t.replace("!new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor",
                                              "!new:cosyvoice.hifigan.f0_predictor.Evil"), ("Evil", "not allowed")),
        "new of a system class": (lambda t: t + "\nproc: !new:subprocess.Popen\n    args: ['true']\n", ("subprocess.Popen",)),
        "name of a function": (lambda t: t + "\nf: !name:os.system\n", ("!name:os.system",)),
        "python object tag": (lambda t: t + f"\nx: !!python/object/apply:os.system ['touch {marker}']\n",
                              ("!!python/object/apply", "not allowed")),
        "module tag": (lambda t: t + "\nm: !module:os\n", ("!module:os",)),
        "include tag": (lambda t: t + "\ni: !include:/etc/passwd\n", ("!include:/etc/passwd",)),
        "alias": (lambda t: t + "\na: &a [1, 2]\nb: [*a, *a]\n", ("aliases",)),
        "a training name as a flow part": (
            lambda t: t.replace("    only_mask_loss: True", "    only_mask_loss: !name:cosyvoice.dataset.processor.batch"),
            ("!name:cosyvoice.dataset.processor.batch", "cannot be part of the exported model")),
        "unknown argument": (lambda t: t.replace("    only_mask_loss: True", "    only_mask_loss: True\n    evil: 1"),
                             ("CausalMaskedDiffWithXvec has no argument 'evil'",)),
        "reference to nothing": (lambda t: t.replace("!ref <spk_embed_dim>", "!ref <nowhere>"), ("<nowhere>", "not defined")),
    }


@pytest.mark.parametrize("case", list(_hostile("m")))
def test_hostile_config_never_runs_and_never_converts(case, broken_checkpoint, tmp_path, convert_cli, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / MARKER
    edit, needles = _hostile(marker)[case]
    path = broken_checkpoint / "cosyvoice2.yaml"
    path.write_text(edit(path.read_text()))
    out = tmp_path / "model"
    r = convert_cli(broken_checkpoint, out)
    _one_line_error(r, "cosyvoice2.yaml", *needles)
    assert not marker.exists() and not (tmp_path / MARKER).exists()
    assert not out.exists()


def test_a_cosyvoice3_yaml_alone_names_the_files_a_cosyvoice3_checkpoint_has(tmp_path, convert_cli):  # noqa: F811
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "cosyvoice3.yaml").write_text(upstream_yaml.cosyvoice3())
    r = convert_cli(tmp_path / "ckpt", tmp_path / "out")
    _one_line_error(r, "llm.pt", "missing", "CosyVoice3", "speech_tokenizer_v3.onnx")


def test_the_error_names_the_line_of_the_tag(broken_checkpoint):
    path = broken_checkpoint / "cosyvoice2.yaml"
    lines = path.read_text().splitlines()
    at = lines.index("    only_mask_loss: True")
    lines[at] = "    only_mask_loss: !apply:os.system ['true']"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConvertError, match=rf"cosyvoice2.yaml:{at + 1}: tag '!apply:os.system'"):
        read(broken_checkpoint)


@pytest.fixture(scope="module")
def example_checkpoint(tmp_path_factory):
    """A miniature whose yaml is upstream's earlier example config: the encoder attends to every token
    while streaming (no static chunk), the estimator keeps its 50-frame chunks."""
    from cosyvoice_server.convert.miniature import build

    return build(tmp_path_factory.mktemp("ckpt") / "CosyVoice2-example", "mini", seed=3, config="earlier")


def test_upstream_earlier_example_config_converts_and_streams_as_upstream(example_checkpoint, tmp_path):
    from cosyvoice_server.convert.convert import convert
    from cosyvoice_server.engine.pipeline import Pipeline

    assert "use_dynamic_chunk: True" in (example_checkpoint / "cosyvoice2.yaml").read_text()
    pipeline = Pipeline(convert(example_checkpoint, tmp_path / "model", ["fp32"]), "cpu", "fp32")
    # Its encoder's output for old frames changes as tokens arrive: streamed chunks must re-run the prefix.
    assert pipeline.manifest.flow.incremental is None and pipeline.flow.new_cache() is None
    reference = Reference.load(example_checkpoint)
    rng = np.random.default_rng(4)
    err = 0.0
    for speaker, n, offset, end, final in (("spk_a", 90, 0, 25, False), ("spk_b", 90, 25, 75, False),
                                           ("spk_a", 61, 0, 61, True)):
        tokens = rng.integers(0, 6561, n).tolist()
        got = pipeline.flow.run([_chunk(pipeline, tokens, speaker, offset, end, final)])[0]
        want = reference.flow_mel(tokens[: end + (0 if final else 3)], reference.speaker(speaker),
                                  streaming=not final, finalize=final)[:, 2 * offset:]
        assert got.shape == want.shape
        err = max(err, float(np.abs(got - want).max()))
    report("flow mel, upstream's earlier example config (encoder without chunks)", err)
    assert err <= TOL
    shutil.rmtree(tmp_path / "model")
