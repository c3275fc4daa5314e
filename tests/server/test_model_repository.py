"""The model directory format: the bundled models, validation and the errors a broken directory gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
import yaml

from cosyvoice_server.config import BUNDLED_MODEL, BUNDLED_MODELS
from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.fetch import FetchError, fetch
from cosyvoice_server.model.manifest import ModelLoadError, load_manifest, validate_model_dir


@pytest.fixture
def model(tmp_path) -> Path:
    return Path(shutil.copytree(BUNDLED_MODEL, tmp_path / "model"))


def test_convert_reproduces_the_bundled_models_byte_for_byte(tmp_path):
    """`make tiny-model`: what convert makes of the miniature checkpoints is what is committed."""
    for module in ("torch", "transformers", "hyperpyyaml", "cosyvoice"):
        pytest.importorskip(module)
    from cosyvoice_server.convert.tiny import MODELS, build

    build(tmp_path)
    for name in MODELS:
        committed, out = BUNDLED_MODELS / name, tmp_path / name
        files = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()), name
        for rel in files:
            assert (out / rel).read_bytes() == (committed / rel).read_bytes(), (name, rel)


@pytest.mark.parametrize("name, family", [("tiny", "CosyVoice2"), ("tiny3", "CosyVoice3")])
def test_bundled_models_are_converted_ones_of_each_family(name, family):
    path = BUNDLED_MODELS / name
    m = validate_model_dir(path)
    assert m.family == family and "Converted from" in m.description
    assert m.flow.incremental is not None  # streamed chunks compute only their new frames, as a converted model's
    assert sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) < 64 * 2**20
    est = onnx.load(str(path / m.flow.estimator.files["fp32"]))
    assert [i.name for i in est.graph.input] == ["x", "mask", "mu", "t", "spks", "cond", "streaming"]
    assert [o.name for o in est.graph.output] == ["estimator_out"]
    assert est.opset_import[0].version == 18
    assert (m.sample_rate, m.token_rate, m.mel_rate, m.samples_per_token) == (24000, 25, 50, 960)
    assert sorted(p.stem for p in (path / m.voices.dir).glob("*.npz")) == ["bright", "default", "warm"]


def test_missing_onnx_file_is_named(model):
    (model / "hift.fp32.onnx").unlink()
    with pytest.raises(ModelLoadError, match=r"hift\.fp32\.onnx: missing \(vocoder, fp32\)"):
        validate_model_dir(model)


def test_corrupt_onnx_file_is_named(model):
    (model / "llm.fp32.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"llm\.fp32\.onnx: not a readable ONNX model"):
        validate_model_dir(model)


def test_wrong_tensor_name_is_reported(model):
    path = model / "flow.decoder.estimator.fp32.onnx"
    m = onnx.load(str(path))
    m.graph.input[3].name = "timestep"
    for node in m.graph.node:
        node.input[:] = ["timestep" if i == "t" else i for i in node.input]
    onnx.save(m, str(path))
    with pytest.raises(ModelLoadError, match=r"estimator\.fp32\.onnx: the flow estimator graph lacks input\(s\) t"):
        validate_model_dir(model)


@pytest.mark.parametrize("elem_type, named", [(onnx.TensorProto.FLOAT16, "float16"), (onnx.TensorProto.INT32, "int32"),
                                               (999, "999")])  # 999: a type number no onnx release has
def test_wrong_tensor_type_is_reported_by_name(model, elem_type, named):
    path = model / "flow.decoder.estimator.fp32.onnx"
    m = onnx.load(str(path))
    m.graph.input[3].type.tensor_type.elem_type = elem_type  # "t"
    onnx.save(m, str(path))
    with pytest.raises(ModelLoadError, match=rf"estimator\.fp32\.onnx: flow estimator input 't' is {named} rank 1, "
                                             r"expected float rank 1"):
        validate_model_dir(model)


def test_manifest_layer_count_must_match_the_llm_graph(model):
    man = yaml.safe_load((model / "model.yaml").read_text())
    man["llm"]["num_layers"] = 3
    (model / "model.yaml").write_text(yaml.safe_dump(man))
    with pytest.raises(ModelLoadError, match=r"lacks input\(s\) past_key_values\.2\.key"):
        validate_model_dir(model)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("llm"), r"llm: Field required"),
    (lambda m: m.update(format="cosyvoice3"), r"format: Input should be 'cosyvoice2-onnx/v1'"),
    (lambda m: m.update(sample_rate=22050), r"rates disagree"),
    (lambda m: m["llm"].update(files={"fp16": "llm.fp16.onnx"}), r"files must include an fp32 entry"),
    (lambda m: m["voices"].update(default="nobody"), r"nobody\.npz: missing"),
    (lambda m: m["voices"].update(aliases={"alloy": "nobody"}),
     r"voices\.aliases: alias 'alloy' points to voice 'nobody', which does not exist \(voices: bright, default, warm\)"),
    (lambda m: m["voices"].update(aliases={"warm": "default"}), r"alias 'warm' has the name of an existing voice"),
    (lambda m: m["voices"].update(aliases={"al loy": "default"}), r"'al loy' is not a voice name"),
])
def test_bad_manifest_fields_are_explained(model, edit, message):
    man = yaml.safe_load((model / "model.yaml").read_text())
    edit(man)
    (model / "model.yaml").write_text(yaml.safe_dump(man))
    with pytest.raises(ModelLoadError, match=message):
        validate_model_dir(model)


def test_server_voice_aliases_are_checked_against_the_voices(model):
    assert validate_model_dir(model, extra_aliases={"narrator": "warm"}).voices.aliases["alloy"] == "default"
    with pytest.raises(ModelLoadError, match=r"--voice-aliases: alias 'narrator' points to voice 'nobody'"):
        validate_model_dir(model, extra_aliases={"narrator": "nobody"})


def test_broken_voice_file_is_named(model):
    (model / "voices" / "warm.npz").write_bytes(b"junk")
    with pytest.raises(ModelLoadError, match=r"warm\.npz: not a readable \.npz"):
        Pipeline(model, "cpu")


def test_fetch_unpacks_a_checksummed_archive(tmp_path):
    import hashlib
    import tarfile

    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(BUNDLED_MODEL, arcname="cosyvoice2-tiny")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    root = fetch(archive.as_uri(), tmp_path / "dest", digest)
    assert root == tmp_path / "dest"  # the folder inside the archive is lifted: the server reads --dest
    validate_model_dir(root)
    with pytest.raises(FetchError, match="SHA-256 mismatch"):
        fetch(str(archive), tmp_path / "dest2", "0" * 64)
    with pytest.raises(FetchError, match="unsupported scheme 'ftp'"):
        fetch("ftp://example/model.tgz", tmp_path / "dest3")


def test_the_interface_check_reads_what_onnx_load_reads(model):
    """Start-up reads each graph's inputs, outputs and initializer names without decoding the weights."""
    from cosyvoice_server.model.manifest import _interface

    for path in sorted(model.glob("*.onnx")):
        full = onnx.load(str(path), load_external_data=False)
        inputs, outputs, init_names, external = _interface(path)
        assert [v.SerializeToString() for v in inputs] == [v.SerializeToString() for v in full.graph.input], path
        assert [v.SerializeToString() for v in outputs] == [v.SerializeToString() for v in full.graph.output], path
        assert init_names == {t.name for t in full.graph.initializer}, path
        assert external == {d.value for t in full.graph.initializer for d in t.external_data if d.key == "location"}
    # the whole and the incremental graph of one module keep one copy of its weights
    for stem in ("flow_encoder", "flow.decoder.estimator"):
        assert {p.name for p in model.glob(stem + ".*")} == {
            f"{stem}.fp32.onnx", f"{stem}.incremental.fp32.onnx", f"{stem}.fp32.weights"}
        for graph in (f"{stem}.fp32.onnx", f"{stem}.incremental.fp32.onnx"):
            assert _interface(model / graph)[3] == {f"{stem}.fp32.weights"}


def test_missing_weights_and_an_incremental_encoder_without_its_chunk_are_named(model):
    (model / "flow_encoder.fp32.weights").unlink()
    with pytest.raises(ModelLoadError, match=r"flow_encoder\.fp32\.weights: missing \(the weights of flow_encoder\.fp32\.onnx\)"):
        validate_model_dir(model)
    man = yaml.safe_load((model / "model.yaml").read_text())
    del man["flow"]["incremental"]["encoder_chunk_tokens"]
    (model / "model.yaml").write_text(yaml.safe_dump(man))
    with pytest.raises(ModelLoadError, match=r"flow\.incremental: Value error, encoder needs encoder_chunk_tokens"):
        load_manifest(model)


@pytest.mark.parametrize("location", ["../outside.weights", "/etc/passwd", "sub/flow_encoder.fp32.weights", ".."])
def test_weights_outside_the_model_directory_are_refused(model, location, tmp_path):
    """A graph naming weights elsewhere (another directory, an absolute path) is refused before the runtime
    would open them."""
    import onnx

    (tmp_path / "outside.weights").write_bytes((model / "flow_encoder.fp32.weights").read_bytes())
    graph = onnx.load(str(model / "flow_encoder.fp32.onnx"), load_external_data=False)
    for t in graph.graph.initializer:
        for d in t.external_data:
            if d.key == "location":
                d.value = location
    onnx.save(graph, str(model / "flow_encoder.fp32.onnx"))
    with pytest.raises(ModelLoadError, match=r"flow_encoder\.fp32\.onnx: its weights must lie in a file beside it"):
        validate_model_dir(model)


def test_a_model_without_an_incremental_encoder_re_runs_the_encoder(model):
    """A model converted before the encoder had its incremental graph: streamed chunks re-run the encoder."""
    man = yaml.safe_load((model / "model.yaml").read_text())
    del man["flow"]["incremental"]["encoder"]
    (model / "model.yaml").write_text(yaml.safe_dump(man))
    (model / "flow_encoder.incremental.fp32.onnx").unlink()
    from cosyvoice_server.startup import Phases

    old, new = Phases(emit=lambda line: None), Phases(emit=lambda line: None)
    p = Pipeline(model, "cpu", phases=old)
    assert p.flow.incremental is not None and p.flow.incremental_encoder is None
    full = Pipeline(BUNDLED_MODEL, "cpu", phases=new)
    assert p.flow.cache_bytes_per_frame() < full.flow.cache_bytes_per_frame()
    # each session's load is a start-up phase (cosyvoice_startup_phase_seconds), the streamed flow's graphs too
    sessions = {"session_llm", "session_flow_encoder", "session_flow_estimator", "session_flow_incremental", "session_vocoder"}
    assert {k for k in new.seconds if k.startswith("session_")} == sessions | {"session_flow_incremental_encoder"}
    assert {k for k in old.seconds if k.startswith("session_")} == sessions


@pytest.mark.parametrize("cut", [0, 1, 7, 0.5, -3])
def test_a_truncated_onnx_file_is_named(model, cut):
    path = model / "flow_encoder.fp32.onnx"
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * cut) if isinstance(cut, float) else cut])
    with pytest.raises(ModelLoadError, match=r"flow_encoder\.fp32\.onnx: not a readable ONNX model"):
        validate_model_dir(model)
