"""`cosyvoice-server convert`: a published CosyVoice2 checkpoint -> this server's model repository.

    cosyvoice-server convert --checkpoint CosyVoice2-0.5B --out models/cosyvoice2-0.5b [--precision fp32,fp16]

The LLM's trained weights (`llm.pt`) go into the project's own Qwen2 decoder-step graph; the flow encoder,
estimator and HiFT are exported from upstream's modules (see export.py). Every SFT speaker of
`spk2info.pt` becomes a voice; `campplus.onnx` and `speech_tokenizer_v2.onnx` are copied for prompt
encoding; upstream's fixed flow noise is saved. The result is written to a temporary directory beside
`--out`, loaded by the engine to validate it, and only then renamed into place.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import yaml

from ..model.generate import LLMShape, _fp16, _save, _save_npz, build_llm
from . import build, checkpoint, hyperyaml
from .checkpoint import Checkpoint, ConvertError

log = logging.getLogger(__name__)

# Upstream's QwenTokenizer (cosyvoice/tokenizer/tokenizer.py) adds these to the BlankEN tokenizer; its
# module imports whisper and tiktoken, so the list is kept here.
SPECIAL_TOKENS = {
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "additional_special_tokens": [
        "<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]", "[laughter]",
        "[cough]", "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]",
        "[vocalized-noise]", "[lipsmack]", "[mn]",
    ],
}
TOKEN_HOP = 25  # CosyVoice2Model.token_hop_len (cli/model.py): the first streamed chunk, whatever the yaml says
SPECIAL = 3  # Qwen2LM's head: speech tokens, eos, and two fill tokens
EXTERNAL_DATA_BYTES = 1 << 30  # past this, weights go beside the graph (protobuf's 2 GB limit)


def _llm(ck: Checkpoint, out: Path, precisions: list[str]) -> tuple[dict, dict[str, str]]:
    q = ck.qwen
    llm = ck.config["llm"]
    speech = llm.get("speech_token_size")
    if not isinstance(speech, int):
        raise ConvertError(f"{ck.path('cosyvoice2.yaml')}: llm.speech_token_size is {speech!r}, expected an integer")
    try:
        shape = LLMShape(hidden=int(q["hidden_size"]), layers=int(q["num_hidden_layers"]), heads=int(q["num_attention_heads"]),
                         kv_heads=int(q.get("num_key_value_heads", q["num_attention_heads"])), mlp=int(q["intermediate_size"]),
                         speech_vocab=speech, rope_theta=float(q.get("rope_theta", 10000.0)),
                         rms_eps=float(q.get("rms_norm_eps", 1e-6)))
        text_vocab = int(q["vocab_size"])
    except KeyError as exc:
        raise ConvertError(f"{ck.path('CosyVoice-BlankEN/config.json')}: missing {exc.args[0]!r}") from exc
    if llm.get("llm_input_size") not in (None, shape.hidden):
        raise ConvertError(f"{ck.path('cosyvoice2.yaml')}: llm_input_size differs from the Qwen2 hidden_size {shape.hidden}")
    h, kv, body = shape.hidden, shape.kv_heads * shape.head_dim, "llm.model.model."
    expected = {"llm_embedding.weight": (2, h), "speech_embedding.weight": (shape.vocab, h),
                "llm_decoder.weight": (shape.vocab, h), "llm_decoder.bias": (shape.vocab,),
                body + "embed_tokens.weight": (text_vocab, h), body + "norm.weight": (h,)}
    for i in range(shape.layers):
        p = f"{body}layers.{i}."
        expected |= {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
                     p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
                     p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
                     p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (shape.mlp, h),
                     p + "mlp.up_proj.weight": (shape.mlp, h), p + "mlp.down_proj.weight": (h, shape.mlp),
                     p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    path = ck.path("llm.pt")
    state = checkpoint.load_state(path)
    checkpoint.check_tensors(path, state, expected, optional={"llm.model.lm_head.weight"})

    def weight(name: str, shape_: tuple[int, ...]) -> np.ndarray:
        if name.startswith("layers."):
            _, i, module, kind = name.split(".")
            group = "mlp" if module.endswith(("gate_proj", "up_proj", "down_proj")) else "self_attn"
            key = f"{body}layers.{i}.{module}.{kind}" if module.endswith("layernorm") else f"{body}layers.{i}.{group}.{module}.{kind}"
        elif name == "norm.weight":
            key = body + "norm.weight"
        else:
            key = name
        t = state[key].detach().float().numpy()
        return np.ascontiguousarray(t.T if t.ndim == 2 else t)  # torch Linear is [out, in]; the builder takes [in, out]

    model = build_llm(shape, weight)
    files = _write(model, out, "llm", precisions)
    _save_npz(out / "llm_embeddings.npz", {
        "text_embedding": state[body + "embed_tokens.weight"].float().numpy(),
        "speech_embedding": state["speech_embedding.weight"].float().numpy(),
        "llm_embedding": state["llm_embedding.weight"].float().numpy(),
    })
    sampling = llm.get("sampling")
    target = sampling.target if isinstance(sampling, hyperyaml.Call) else sampling
    if target != "cosyvoice.utils.common.ras_sampling":
        raise ConvertError(f"{ck.path('cosyvoice2.yaml')}: llm.sampling is {target!r}; "
                           "CosyVoice2 uses cosyvoice.utils.common.ras_sampling")
    spec = {
        "files": files, "embeddings": "llm_embeddings.npz", "hidden_size": h, "num_layers": shape.layers,
        "num_kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "speech_token_size": speech,
        "sampling": {k: sampling.kwargs[k] for k in ("top_k", "top_p", "win_size", "tau_r") if k in sampling.kwargs},
    }
    return spec, {"speech": speech}


def _write(model, out: Path, stem: str, precisions: list[str]) -> dict[str, str]:
    external = sum(len(t.raw_data) for t in model.graph.initializer) > EXTERNAL_DATA_BYTES
    files = {}
    half = _fp16(model) if "fp16" in precisions else None  # before saving: external data rewrites the weights
    files["fp32"] = f"{stem}.fp32.onnx"
    _save(model, out / files["fp32"], external)
    if half is not None:
        files["fp16"] = f"{stem}.fp16.onnx"
        _save(half, out / files["fp16"], external)
    return files


def _modules(ck: Checkpoint):
    """Upstream's flow and HiFT, built from the yaml by build.py's allow-list, with the checkpoint's weights."""
    import torch

    modules = []
    for key, name, strip in (("flow", "flow.pt", ""), ("hift", "hift.pt", "generator.")):
        try:
            module = build.build(ck.config[key], ck.path("cosyvoice2.yaml"))
        except hyperyaml.ConfigError as exc:
            raise ConvertError(str(exc)) from exc
        path = ck.path(name)
        state = {k[len(strip):] if strip and k.startswith(strip) else k: v for k, v in checkpoint.load_state(path).items()}
        checkpoint.check_tensors(path, state, {k: tuple(v.shape) for k, v in module.state_dict().items()})
        module.load_state_dict(state, strict=True)
        module.eval()
        modules.append(module)
    torch.set_grad_enabled(False)
    return modules


def _voices(ck: Checkpoint, out: Path, ratio: int) -> list[str]:
    """spk2info.pt -> voices/<speaker>.npz: SFT speakers (an embedding) and saved zero-shot speakers
    (embedding, prompt text, prompt speech tokens and features)."""
    path = ck.path("spk2info.pt")
    info = checkpoint.load_state(path)
    if not info:
        raise ConvertError(f"{path}: no speakers")
    (out / "voices").mkdir()
    names = []
    for name, spk in info.items():
        if not isinstance(spk, dict) or not ({"embedding", "flow_embedding"} & set(spk)):
            raise ConvertError(f"{path}: speaker {name!r} has no embedding (keys: {', '.join(map(str, spk)) if isinstance(spk, dict) else type(spk).__name__})")
        if "/" in str(name) or str(name).startswith("."):
            raise ConvertError(f"{path}: speaker name {name!r} cannot be a file name")
        emb = (spk.get("flow_embedding") if "flow_embedding" in spk else spk["embedding"]).float().reshape(-1).numpy()
        tokens = spk.get("flow_prompt_speech_token")
        tokens = tokens.reshape(-1).long().numpy() if tokens is not None else np.zeros(0, np.int64)
        feat = spk.get("prompt_speech_feat")
        feat = feat.reshape(-1, feat.shape[-1]).float().numpy() if feat is not None else np.zeros((0, 80), np.float32)
        text = spk.get("prompt_text")
        text = text.reshape(-1).long().numpy() if text is not None else np.zeros(0, np.int64)
        if len(feat) != ratio * len(tokens):
            raise ConvertError(f"{path}: speaker {name!r} has {len(tokens)} prompt tokens but {len(feat)} prompt frames "
                               f"(expected {ratio * len(tokens)})")
        _save_npz(out / "voices" / f"{name}.npz", {"embedding": emb.astype(np.float32), "prompt_text_tokens": text,
                                                   "prompt_speech_tokens": tokens, "prompt_mel": feat.astype(np.float32)})
        names.append(str(name))
    return names


def _tokenizer(ck: Checkpoint, out: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ck.path("CosyVoice-BlankEN")))
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))


def convert(ckpt: Path, out: Path, precisions: list[str], name: str | None = None) -> Path:
    """Writes the model repository for `ckpt` at `out` (which must not exist yet) and returns `out`."""
    from . import export, upstream

    unknown = sorted(set(precisions) - {"fp32", "fp16"})
    if unknown or "fp32" not in precisions:
        raise ConvertError(f"--precision {','.join(precisions)}: choose fp32 or fp32,fp16")
    if out.exists():
        raise ConvertError(f"{out}: already exists; convert writes a new directory (remove it or pick another --out)")
    ck = checkpoint.read(ckpt)
    try:
        upstream.load()
    except upstream.UpstreamMissing as exc:
        raise ConvertError(str(exc)) from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would keep the server's (non-root) user out after the rename
    try:
        _write_repository(ck, tmp, precisions, name or ckpt.name, export)
        from ..engine.pipeline import Pipeline

        for p in precisions:
            Pipeline(tmp, "cpu", p)  # validates every file and builds every session
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_repository(ck: Checkpoint, tmp: Path, precisions: list[str], name: str, export) -> None:
    from . import incremental

    flow, hift = _modules(ck)
    llm_spec, sizes = _llm(ck, tmp, precisions)
    if int(flow.vocab_size) != sizes["speech"]:
        raise ConvertError(f"{ck.path('cosyvoice2.yaml')}: flow.vocab_size {flow.vocab_size} != llm.speech_token_size {sizes['speech']}")
    sample_rate = int(ck.config.get("sample_rate", 24000))
    ratio = int(flow.token_mel_ratio)
    token_rate = int(flow.input_frame_rate)
    hop = int(hift.m_source.l_sin_gen.upsample_scale)
    if sample_rate != token_rate * ratio * hop:
        raise ConvertError(f"{ck.path('cosyvoice2.yaml')}: rates disagree: sample_rate {sample_rate} != "
                           f"{token_rate} tokens/s x {ratio} frames/token x {hop} samples/frame")
    cfm = flow.decoder
    if getattr(cfm, "t_scheduler", "cosine") != "cosine":
        raise ConvertError(f"{ck.path('cosyvoice2.yaml')}: flow t_scheduler {cfm.t_scheduler!r}; CosyVoice2 uses 'cosine'")
    # The encoder either attends to everything while streaming (static_chunk_size 0, upstream's example
    # config) or in the estimator's chunks (the released models).
    chunk = int(flow.encoder.static_chunk_size)
    if chunk and int(cfm.estimator.static_chunk_size) != chunk * ratio:
        raise ConvertError(f"{ck.path('cosyvoice2.yaml')}: estimator static_chunk_size {cfm.estimator.static_chunk_size} "
                           f"!= encoder static_chunk_size {chunk} x token_mel_ratio {ratio}")
    files = {}
    stages = [("flow_encoder", lambda p: export.export_flow_encoder(flow, p)),
              ("flow.decoder.estimator", lambda p: export.export_estimator(cfm.estimator, p, flow.output_size, flow.output_size)),
              ("hift", lambda p: export.export_hift(hift, p, hop))]
    # Streaming can skip what earlier chunks computed only where both the encoder and the estimator are
    # chunk-causal; otherwise every chunk re-runs the flow over the whole prefix, as upstream does.
    not_causal = incremental.not_chunk_causal(cfm.estimator) if chunk else "the encoder streams with full context"
    if not_causal:
        log.info("no incremental streaming flow: %s", not_causal)
    else:
        stages.append(("flow.decoder.estimator.incremental",
                       lambda p: incremental.export_incremental_estimator(cfm.estimator, p, flow.output_size, flow.output_size)))
    for stem, fn in stages:
        fn(tmp / f"{stem}.fp32.onnx")
        import onnx

        model = onnx.load(str(tmp / f"{stem}.fp32.onnx"))
        (tmp / f"{stem}.fp32.onnx").unlink()
        files[stem] = _write(model, tmp, stem, precisions)
    np.save(tmp / "flow_noise.npy", cfm.rand_noise[0].float().numpy())
    _tokenizer(ck, tmp)
    voices = _voices(ck, tmp, ratio)
    for f in ("campplus.onnx", "speech_tokenizer_v2.onnx"):
        shutil.copyfile(ck.path(f), tmp / f)
    manifest = {
        "format": "cosyvoice2-onnx/v1",
        "name": name,
        "description": f"Converted from the CosyVoice2 checkpoint '{ck.dir.name}' by cosyvoice-server convert.",
        "sample_rate": sample_rate,
        "token_rate": token_rate,
        "mel_rate": token_rate * ratio,
        "hop_samples": hop,
        "frontend": {"tokenizer": "tokenizer.json"},
        "llm": llm_spec,
        "flow": {
            "encoder": {"files": files["flow_encoder"]},
            "estimator": {"files": files["flow.decoder.estimator"]},
            "n_timesteps": 10,  # CausalMaskedDiffWithXvec.inference passes n_timesteps=10
            "cfg_rate": float(cfm.inference_cfg_rate),
            "pre_lookahead_tokens": int(flow.pre_lookahead_len),
            "noise": "flow_noise.npy",
            "mel_bins": int(flow.output_size),
            "spk_embed_dim": int(flow.spk_embed_affine_layer.in_features),
        } | ({} if not_causal else {"incremental": {"files": files["flow.decoder.estimator.incremental"],
                                                    "chunk_frames": int(cfm.estimator.static_chunk_size),
                                                    "encoder_chunk_tokens": chunk}}),
        "vocoder": {"files": files["hift"]},
        "streaming": {"first_hop_tokens": TOKEN_HOP},
        "voices": {"dir": "voices", "default": voices[0]},
        "prompt_encoders": {"campplus": "campplus.onnx", "speech_tokenizer": "speech_tokenizer_v2.onnx"},
    }
    (tmp / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True))
