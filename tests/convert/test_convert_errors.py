"""Bad checkpoints get one line naming the file, tensor or setting, and leave nothing behind."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from cosyvoice_server.cli import main


@dataclass
class Result:
    returncode: int
    stderr: str


@pytest.fixture
def convert_cli(capsys):
    """`cosyvoice-server convert` as the console script runs it (in this process: torch loads once)."""

    def run(ckpt, out) -> Result:
        code = main(["convert", "--checkpoint", str(ckpt), "--out", str(out)])
        return Result(code, capsys.readouterr().err)

    return run


def _one_line_error(r, *needles):
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def _damage_llm(ckpt, edit):
    state = torch.load(ckpt / "llm.pt", weights_only=True)
    edit(state)
    torch.save(state, ckpt / "llm.pt")


CASES = {
    "missing file": (lambda c: (c / "hift.pt").unlink(), ("hift.pt", "missing")),
    "missing tokenizer config": (lambda c: (c / "CosyVoice-BlankEN" / "config.json").unlink(), ("CosyVoice-BlankEN/config.json",)),
    "wrong tensor shape": (lambda c: _damage_llm(c, lambda s: s.__setitem__("speech_embedding.weight", torch.zeros(10, 64))),
                           ("llm.pt", "speech_embedding.weight", "[10, 64]")),
    "missing tensor": (lambda c: _damage_llm(c, lambda s: s.pop("llm.model.model.layers.1.mlp.up_proj.weight")),
                       ("llm.pt", "missing tensor", "layers.1.mlp.up_proj.weight")),
    "unexpected tensor": (lambda c: _damage_llm(c, lambda s: s.__setitem__("extra.weight", torch.zeros(1))),
                          ("llm.pt", "unexpected tensor", "extra.weight")),
    "CosyVoice 1 yaml": (lambda c: (c / "cosyvoice2.yaml").rename(c / "cosyvoice.yaml"), ("cosyvoice.yaml", "CosyVoice 1")),
    "CosyVoice 3 model in cosyvoice2.yaml": (
        lambda c: (c / "cosyvoice2.yaml").write_text((c / "cosyvoice2.yaml").read_text().replace(
            "cosyvoice.llm.llm.Qwen2LM", "cosyvoice.llm.llm.CosyVoice3LM")), ("a CosyVoice3 model", "CosyVoice3LM")),
    "corrupt state dict": (lambda c: (c / "flow.pt").write_bytes(b"garbage"), ("flow.pt", "not a readable")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_gets_one_line_and_no_output(case, broken_checkpoint, tmp_path, convert_cli):
    damage, needles = CASES[case]
    damage(broken_checkpoint)
    out = tmp_path / "model"
    r = convert_cli(broken_checkpoint, out)
    _one_line_error(r, *needles)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".model")]


def test_existing_output_is_never_overwritten(checkpoint, tmp_path, convert_cli):
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep").write_text("x")
    _one_line_error(convert_cli(checkpoint, out), "already exists")
    assert (out / "keep").read_text() == "x"


def test_converted_directory_has_every_file_and_every_speaker(converted):
    from cosyvoice_server.engine.pipeline import Pipeline
    from cosyvoice_server.model.manifest import validate_model_dir

    m = validate_model_dir(converted, "fp16")
    assert sorted(p.name for p in (converted / "voices").iterdir()) == ["spk_a.npz", "spk_b.npz"]
    for f in ("campplus.onnx", "speech_tokenizer_v2.onnx", "flow_noise.npy", "tokenizer.json", "llm_embeddings.npz"):
        assert (converted / f).is_file()
    p = Pipeline(converted, "cpu", "fp32")
    assert len(p.voices["spk_b"].prompt_speech_tokens) == 17 and len(p.voices["spk_a"].prompt_speech_tokens) == 0
    assert m.streaming.first_hop_tokens == 25 and m.flow.pre_lookahead_tokens == 3
    # upstream's current config streams chunk-causally: the new-frames-only estimator ships, in both precisions
    assert m.flow.incremental is not None and sorted(m.flow.incremental.files) == ["fp16", "fp32"]
    assert (m.flow.incremental.chunk_frames, m.flow.incremental.encoder_chunk_tokens) == (50, 25)
    # upstream's buffer: torch.manual_seed(0); torch.randn([1, 80, 15000])
    torch.manual_seed(0)
    np_noise = torch.randn([1, 80, 15000])[0].numpy()
    assert np.array_equal(np.load(converted / "flow_noise.npy"), np_noise)


def test_weights_written_beside_a_graph_are_readable_by_the_servers_user(tmp_path):
    """A graph over protobuf's limit keeps its weights in `<graph>.data`; the server (another, non-root user in
    the pod) must be able to read it, as it reads the graph."""
    import stat

    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from cosyvoice_server.convert.files import save_onnx

    w = numpy_helper.from_array(np.arange(1024, dtype=np.float32).reshape(32, 32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [w])
    path = tmp_path / "llm.fp32.onnx"
    save_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path, external=True)
    data = tmp_path / "llm.fp32.onnx.data"
    assert data.is_file() and onnx.load(str(path), load_external_data=False).graph.initializer[0].data_location == 1
    for f in (path, data):
        assert f.stat().st_mode & stat.S_IROTH, f"{f.name} is {oct(f.stat().st_mode)}"
    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": np.ones((1, 32), np.float32)})[0]
    assert y[0, 0] == np.arange(0, 1024, 32).sum()
