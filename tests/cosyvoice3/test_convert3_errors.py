"""A damaged CosyVoice3 checkpoint gets one line naming the file and the problem, and no output directory."""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cosyvoice_server.cli import main  # noqa: E402


def _damage_state(path, edit):
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def _edit_yaml(ckpt, old, new):
    path = ckpt / "cosyvoice3.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


CASES = {
    "missing speech tokenizer": (lambda c: (c / "speech_tokenizer_v3.onnx").unlink(),
                                 ("speech_tokenizer_v3.onnx", "missing", "CosyVoice3")),
    "CosyVoice2 flow in cosyvoice3.yaml": (
        lambda c: _edit_yaml(c, "cosyvoice.flow.flow.CausalMaskedDiffWithDiT", "cosyvoice.flow.flow.CausalMaskedDiffWithXvec"),
        ("cosyvoice3.yaml", "a CosyVoice2 model", "CausalMaskedDiffWithDiT")),
    "a decoder bias CosyVoice3LM has not": (
        lambda c: _damage_state(c / "llm.pt", lambda s: s.__setitem__("llm_decoder.bias", torch.zeros(6761))),
        ("llm.pt", "unexpected tensor", "llm_decoder.bias")),
    "speech head of CosyVoice2's size": (
        lambda c: _damage_state(c / "llm.pt", lambda s: s.__setitem__("llm_decoder.weight", torch.zeros(6564, 64))),
        ("llm.pt", "llm_decoder.weight", "[6564, 64]", "[6761, 64]")),
    "a DiT without its rotary frequencies": (
        lambda c: _damage_state(c / "flow.pt", lambda s: s.pop("decoder.estimator.rotary_embed.inv_freq")),
        ("flow.pt", "missing tensor", "rotary_embed.inv_freq")),
    "a source of other harmonics": (lambda c: _edit_yaml(c, "nb_harmonics: 8", "nb_harmonics: 7"),
                                    ("cosyvoice3.yaml", "CausalHiFTGenerator", "nb_harmonics 8")),
    "an argument the DiT does not take": (lambda c: _edit_yaml(c, "ff_mult: 2", "ff_mult: 2\n            qk_norm: rms"),
                                          ("cosyvoice3.yaml", "DiT has no argument 'qk_norm'")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_cosyvoice3_checkpoint_gets_one_line_and_no_output(case, golden, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(golden / "ckpt", ckpt)
    damage, needles = CASES[case]
    damage(ckpt)
    out = tmp_path / "model"
    code = main(["convert", "--checkpoint", str(ckpt), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle in err[0], err[0]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".model")]


def test_a_release_without_spk2info_is_refused_without_a_voice_and_converts_with_one(golden, tmp_path, capsys):
    """Releases may ship no saved speakers: convert says how to give one, and --voice makes it from a clip as
    the server registers one (CosyVoice3's system prompt before the transcript, the whole-band prompt mel)."""
    import io

    import numpy as np
    import soundfile as sf

    from cosyvoice_server.engine.pipeline import Pipeline

    ckpt = tmp_path / "ckpt"
    shutil.copytree(golden / "ckpt", ckpt)
    (ckpt / "spk2info.pt").unlink()
    assert main(["convert", "--checkpoint", str(ckpt), "--out", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert "no speakers" in err and "--voice NAME=CLIP.wav:TRANSCRIPT" in err and not (tmp_path / "none").exists()
    with np.load(golden / "feat.npz") as f:
        clip, feat = f["clip_24k"].ravel(), f["speech_feat"].reshape(-1, 80)
    buf = io.BytesIO()
    sf.write(buf, clip, 24000, format="WAV", subtype="FLOAT")
    (tmp_path / "rita.wav").write_bytes(buf.getvalue())
    out = tmp_path / "model"
    assert main(["convert", "--checkpoint", str(ckpt), "--out", str(out), "--voice",
                 f"rita={tmp_path / 'rita.wav'}:A clip of my voice.", "--voice", f"cross={tmp_path / 'rita.wav'}"]) == 0
    p = Pipeline(out, "cpu", "fp32")
    assert p.manifest.voices.default == "rita" and sorted(p.voices) == ["cross", "rita"]
    rita = p.voices["rita"]
    assert list(rita.prompt_text_tokens) == p.frontend.encode("You are a helpful assistant.<|endofprompt|>A clip of my voice.")
    assert np.abs(rita.prompt_mel - feat[: len(rita.prompt_mel)]).max() < 1e-4
    assert p.voices["cross"].cross_lingual
    assert list(p.voices["cross"].prompt_text_tokens) == p.frontend.encode("You are a helpful assistant.<|endofprompt|>")
