"""`cosyvoice-server convert`: a published CosyVoice2 or CosyVoice3 checkpoint -> this server's model repository.

    cosyvoice-server convert --checkpoint Fun-CosyVoice3-0.5B-2512 --out models/cosyvoice3-0.5b [--precision fp32,fp16]

The LLM's trained weights (`llm.pt`) go into the project's own Qwen2 decoder-step graph; the flow's encoder
and estimator and the vocoder are exported from the family's modules: upstream's own classes for
CosyVoice2 (export.py), the project's implementation of upstream's CosyVoice3 classes (dit_flow.py,
causal_hift.py, export_dit.py). Every speaker of `spk2info.pt` becomes a voice; `campplus.onnx` and the
speech tokenizer are copied for prompt encoding; upstream's fixed noise is saved (the flow's, and
CosyVoice3's vocoder source). `model.yaml` describes the family for the engine. The result is written to a
temporary directory beside `--out`, loaded by the engine to validate it, and only then renamed into place.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ..frontend import END_OF_PROMPT
from ..model.llm_graph import LLMShape, build_llm
from . import build, checkpoint, hyperyaml, tokens
from .files import fp16, save_npz, save_onnx, save_onnx_sharing_weights
from .checkpoint import COSYVOICE3, Checkpoint, ConvertError

log = logging.getLogger(__name__)

TOKEN_HOP = 25  # token_hop_len (cli/model.py, both families): the first streamed chunk, whatever the yaml says
EXTERNAL_DATA_BYTES = 1 << 30  # past this, weights go beside the graph (protobuf's 2 GB limit)
# CosyVoice3Model (cli/model.py): the FSQ tokens of silence and breath, and how many in a row reach the flow.
SILENT_TOKENS = [1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323]
MAX_SILENT_RUN = 5
SYSTEM_PROMPT = "You are a helpful assistant."  # what upstream's CosyVoice3 prompts and instructions start with


@dataclass(frozen=True)
class LLMLayout:
    """Where an upstream LLM class keeps its special rows: `special` outputs after the speech tokens, sos and
    task_id in `llm_embedding` (Qwen2LM) or as rows of `speech_embedding` (CosyVoice3LM), the fill token."""

    special: int
    decoder_bias: bool
    start_rows: tuple[int, int] | None  # sos, task_id as offsets from speech_token_size in speech_embedding
    fill_offset: int


LAYOUTS = {"cosyvoice2": LLMLayout(3, True, None, 2), "cosyvoice3": LLMLayout(200, False, (0, 2), 3)}


def _llm(ck: Checkpoint, out: Path, precisions: list[str]) -> dict:
    q = ck.qwen
    llm = ck.config["llm"]
    layout = LAYOUTS[ck.family.key]
    speech = llm.get("speech_token_size")
    if not isinstance(speech, int):
        raise ConvertError(f"{ck.yaml}: llm.speech_token_size is {speech!r}, expected an integer")
    try:
        shape = LLMShape(hidden=int(q["hidden_size"]), layers=int(q["num_hidden_layers"]), heads=int(q["num_attention_heads"]),
                         kv_heads=int(q.get("num_key_value_heads", q["num_attention_heads"])), mlp=int(q["intermediate_size"]),
                         speech_vocab=speech, rope_theta=float(q.get("rope_theta", 10000.0)),
                         rms_eps=float(q.get("rms_norm_eps", 1e-6)), special=layout.special,
                         decoder_bias=layout.decoder_bias)
        text_vocab = int(q["vocab_size"])
    except KeyError as exc:
        raise ConvertError(f"{ck.path('CosyVoice-BlankEN/config.json')}: missing {exc.args[0]!r}") from exc
    if llm.get("llm_input_size") not in (None, shape.hidden):
        raise ConvertError(f"{ck.yaml}: llm_input_size differs from the Qwen2 hidden_size {shape.hidden}")
    h, kv, body = shape.hidden, shape.kv_heads * shape.head_dim, "llm.model.model."
    expected = {"speech_embedding.weight": (shape.vocab, h), "llm_decoder.weight": (shape.vocab, h),
                body + "embed_tokens.weight": (text_vocab, h), body + "norm.weight": (h,)}
    if layout.start_rows is None:
        expected["llm_embedding.weight"] = (2, h)
    if layout.decoder_bias:
        expected["llm_decoder.bias"] = (shape.vocab,)
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
    speech_embedding = state["speech_embedding.weight"].float().numpy()
    if layout.start_rows is None:
        starts = state["llm_embedding.weight"].float().numpy()
    else:  # the engine reads sos and task_id from one table whatever the family
        starts = speech_embedding[[speech + r for r in layout.start_rows]]
    save_npz(out / "llm_embeddings.npz", {"text_embedding": state[body + "embed_tokens.weight"].float().numpy(),
                                          "speech_embedding": speech_embedding, "llm_embedding": starts})
    sampling = llm.get("sampling")
    target = sampling.target if isinstance(sampling, hyperyaml.Call) else sampling
    if target != "cosyvoice.utils.common.ras_sampling":
        raise ConvertError(f"{ck.yaml}: llm.sampling is {target!r}; {ck.family.title} uses cosyvoice.utils.common.ras_sampling")
    return {
        "files": files, "embeddings": "llm_embeddings.npz", "hidden_size": h, "num_layers": shape.layers,
        "num_kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "speech_token_size": speech,
        "fill_token": speech + layout.fill_offset,
        "sampling": {k: sampling.kwargs[k] for k in ("top_k", "top_p", "win_size", "tau_r") if k in sampling.kwargs},
    }


def _write(model, out: Path, stem: str, precisions: list[str]) -> dict[str, str]:
    external = sum(len(t.raw_data) for t in model.graph.initializer) > EXTERNAL_DATA_BYTES
    files = {}
    half = fp16(model) if "fp16" in precisions else None  # before saving: external data rewrites the weights
    files["fp32"] = f"{stem}.fp32.onnx"
    save_onnx(model, out / files["fp32"], external)
    if half is not None:
        files["fp16"] = f"{stem}.fp16.onnx"
        save_onnx(half, out / files["fp16"], external)
    return files


def _modules(ck: Checkpoint):
    """The family's flow and HiFT, built from the yaml by build.py's allow-list, with the checkpoint's weights.
    The flow is built first, as upstream's yaml builds it: the vocoder's fixed source noise is drawn from the
    random state the flow's construction leaves."""
    import torch

    modules = []
    for key, name, strip in (("flow", "flow.pt", ""), ("hift", "hift.pt", "generator.")):
        try:
            module = build.build(ck.config[key], ck.yaml, build.TABLES[ck.family.key])
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


def _voices(ck: Checkpoint, out: Path, ratio: int, system_prompt: list[int] | None) -> list[str]:
    """spk2info.pt -> voices/<speaker>.npz: SFT speakers (an embedding) and saved zero-shot speakers
    (embedding, prompt text, prompt speech tokens and features). `system_prompt`: CosyVoice3's system prompt
    and <|endofprompt|> as ids, put before a prompt text that lacks them (upstream refuses such a prompt). A
    release without spk2info.pt (or with an empty one) has no voices of its own."""
    path = ck.path("spk2info.pt")
    (out / "voices").mkdir()
    info = checkpoint.load_state(path) if path.is_file() else {}
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
        if system_prompt is not None and system_prompt[-1] not in text:
            log.info("voice %s: its prompt text gets the system prompt (%s lacks it)", name, path.name)
            text = np.concatenate([np.asarray(system_prompt, np.int64), text])
        if len(feat) != ratio * len(tokens):
            raise ConvertError(f"{path}: speaker {name!r} has {len(tokens)} prompt tokens but {len(feat)} prompt frames "
                               f"(expected {ratio * len(tokens)})")
        save_npz(out / "voices" / f"{name}.npz", {"embedding": emb.astype(np.float32), "prompt_text_tokens": text,
                                                   "prompt_speech_tokens": tokens, "prompt_mel": feat.astype(np.float32)})
        names.append(str(name))
    return names


def _tokenizer(ck: Checkpoint, out: Path):
    """tokenizer.json: the BlankEN tokenizer with the family's special tokens, as upstream's tokenizer class."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ck.path("CosyVoice-BlankEN")))
    tok.add_special_tokens(tokens.special_tokens(ck.family.key))
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    return Tokenizer.from_file(str(out / "tokenizer.json"))


@dataclass(frozen=True)
class Options:
    """What `convert` may change in the directory it writes (the defaults keep everything upstream ships)."""

    noise_seconds: float | None = None  # the longest segment the fixed noises cover (upstream's: 300 s)
    aliases: dict[str, str] | None = None  # other names for voices (e.g. OpenAI's alloy), in model.yaml
    # name -> a clip and its transcript: voices made as the server registers one (cross-lingual without a
    # transcript), before the checkpoint's own; the first is the default
    voices: dict[str, tuple[Path, str | None]] | None = None


def convert(ckpt: Path, out: Path, precisions: list[str], name: str | None = None, options: Options = Options()) -> Path:
    """Writes the model repository for `ckpt` at `out` (which must not exist yet) and returns `out`."""
    unknown = sorted(set(precisions) - {"fp32", "fp16"})
    if unknown or "fp32" not in precisions:
        raise ConvertError(f"--precision {','.join(precisions)}: choose fp32 or fp32,fp16")
    if out.exists():
        raise ConvertError(f"{out}: already exists; convert writes a new directory (remove it or pick another --out)")
    ck = checkpoint.read(ckpt)
    if ck.family is not COSYVOICE3:  # CosyVoice3's modules are the project's own: no upstream package needed
        from . import upstream

        try:
            upstream.load()
        except upstream.UpstreamMissing as exc:
            raise ConvertError(str(exc)) from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would keep the server's (non-root) user out after the rename
    try:
        _write_repository(ck, tmp, precisions, name or ckpt.name, options)
        from ..engine.pipeline import Pipeline

        for p in precisions:
            Pipeline(tmp, "cpu", p)  # validates every file and builds every session
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _export(stages: list, tmp: Path, precisions: list[str]) -> dict[str, dict[str, str]]:
    """Runs each (stem, exporter[, weights]) into `stem.fp32.onnx` and writes the precisions asked for. Stages
    that name the same `weights` (graphs of one module) store their weights once, in
    `<weights>.<precision>.weights` beside the graphs."""
    import onnx

    files, shared = {}, {}
    for stem, fn, *weights in stages:
        fn(tmp / f"{stem}.fp32.onnx")
        model = onnx.load(str(tmp / f"{stem}.fp32.onnx"))
        (tmp / f"{stem}.fp32.onnx").unlink()
        if weights:
            shared.setdefault(weights[0], {})[stem] = model
        else:
            files[stem] = _write(model, tmp, stem, precisions)
    for name, models in shared.items():
        for p in precisions:
            save_onnx_sharing_weights({tmp / f"{stem}.{p}.onnx": fp16(m) if p == "fp16" else m for stem, m in models.items()},
                                      tmp / f"{name}.{p}.weights")
        files |= {stem: {p: f"{stem}.{p}.onnx" for p in precisions} for stem in models}
    return files


def _feat_fmax(ck: Checkpoint) -> float | None:
    """The prompt mel's fmax from the yaml's feat_extractor (CosyVoice2 8000, CosyVoice3 null)."""
    feat = ck.config.get("feat_extractor")
    if not isinstance(feat, hyperyaml.Call) or feat.target != "matcha.utils.audio.mel_spectrogram":
        raise ConvertError(f"{ck.yaml}: feat_extractor is not matcha.utils.audio.mel_spectrogram; the prompt mel of a "
                           "new voice could not match what the model was trained on")
    fmax = feat.get("fmax")
    return None if fmax is None else float(fmax)


def _share_weights(stages: list, stem: str, incremental) -> None:
    """Adds `stem`'s incremental graph (exported by `incremental`) as `stem.incremental`; the two graphs come
    from one module, so they keep one copy of its weights, in `stem.<precision>.weights`."""
    i = next(i for i, (s, *_) in enumerate(stages) if s == stem)
    stages[i] = (*stages[i][:2], stem)
    stages.append((f"{stem}.incremental", incremental, stem))


def _cosyvoice2_stages(ck: Checkpoint, flow, hift, hop: int) -> tuple[list, dict, dict]:
    """CosyVoice2's stage exports and their manifest sections (flow additions, streaming)."""
    from . import export, incremental, incremental_encoder

    cfm = flow.decoder
    ratio = int(flow.token_mel_ratio)
    # The encoder either attends to everything while streaming (static_chunk_size 0, upstream's example
    # config) or in the estimator's chunks (the released models).
    chunk = int(flow.encoder.static_chunk_size)
    if chunk and int(cfm.estimator.static_chunk_size) != chunk * ratio:
        raise ConvertError(f"{ck.yaml}: estimator static_chunk_size {cfm.estimator.static_chunk_size} != encoder "
                           f"static_chunk_size {chunk} x token_mel_ratio {ratio}")
    stages = [("flow_encoder", lambda p: export.export_flow_encoder(flow, p)),
              ("flow.decoder.estimator", lambda p: export.export_estimator(cfm.estimator, p, flow.output_size, flow.output_size)),
              ("hift", lambda p: export.export_hift(hift, p, hop))]
    # Streaming can skip what earlier chunks computed only where both the encoder and the estimator are
    # chunk-causal; otherwise every chunk re-runs the flow over the whole prefix, as upstream does.
    not_causal = incremental.not_chunk_causal(cfm.estimator) if chunk else "the encoder streams with full context"
    flow_extra = {}
    if not_causal:
        log.info("no incremental streaming flow: %s", not_causal)
    else:
        _share_weights(stages, "flow.decoder.estimator",
                       lambda p: incremental.export_incremental_estimator(cfm.estimator, p, flow.output_size, flow.output_size))
        flow_extra = {"incremental": {"files": "flow.decoder.estimator.incremental", "chunk_frames": int(cfm.estimator.static_chunk_size),
                                      "encoder_chunk_tokens": chunk}}
        # The encoder too computes only a chunk's new tokens where its own layers allow it.
        not_causal = incremental_encoder.not_chunk_causal(flow.encoder)
        if not_causal:
            log.info("no incremental flow encoder: %s", not_causal)
        else:
            _share_weights(stages, "flow_encoder", lambda p: incremental_encoder.export_incremental_encoder(flow, p))
            flow_extra["incremental"]["encoder"] = {"files": "flow_encoder.incremental"}
    return stages, flow_extra, {}


def _cosyvoice3_stages(flow, hift, hop: int, tmp: Path, samples: int | None) -> tuple[list, dict, dict]:
    """CosyVoice3's stage exports, its vocoder's fixed noise, and their manifest sections."""
    from . import export_dit

    est = flow.decoder.estimator
    stages = [("flow_encoder", lambda p: export_dit.export_flow_encoder(flow, p)),
              ("flow.decoder.estimator", lambda p: export_dit.export_estimator(est, p, flow.output_size, flow.output_size)),
              ("hift", lambda p: export_dit.export_vocoder(hift, p, hop))]
    flow_extra = {}
    not_causal = export_dit.not_chunk_causal(est)
    if not_causal:
        log.info("no incremental streaming flow: %s", not_causal)
    else:
        _share_weights(stages, "flow.decoder.estimator",
                       lambda p: export_dit.export_incremental_estimator(est, p, flow.output_size, flow.output_size))
        flow_extra = {"incremental": {"files": "flow.decoder.estimator.incremental",
                                      "chunk_frames": int(est.static_chunk_size)}}
    np.save(tmp / "hift_noise.npy", hift.fixed_noise(samples).numpy())
    return stages, flow_extra, {"seams": "causal", "look_right_frames": int(hift.look_right_frames)}


def _write_repository(ck: Checkpoint, tmp: Path, precisions: list[str], name: str, options: Options) -> None:
    flow, hift = _modules(ck)
    llm_spec = _llm(ck, tmp, precisions)
    speech = llm_spec["speech_token_size"]
    if int(flow.vocab_size) != speech:
        raise ConvertError(f"{ck.yaml}: flow.vocab_size {flow.vocab_size} != llm.speech_token_size {speech}")
    sample_rate = int(ck.config.get("sample_rate", 24000))
    ratio = int(flow.token_mel_ratio)
    token_rate = int(flow.input_frame_rate)
    hop = int(hift.m_source.l_sin_gen.upsample_scale)
    if sample_rate != token_rate * ratio * hop:
        raise ConvertError(f"{ck.yaml}: rates disagree: sample_rate {sample_rate} != "
                           f"{token_rate} tokens/s x {ratio} frames/token x {hop} samples/frame")
    cfm = flow.decoder
    if getattr(cfm, "t_scheduler", "cosine") != "cosine":
        raise ConvertError(f"{ck.yaml}: flow t_scheduler {cfm.t_scheduler!r}; {ck.family.title} uses 'cosine'")
    fmax = _feat_fmax(ck)
    cosyvoice3 = ck.family is COSYVOICE3
    seconds = options.noise_seconds
    if seconds is not None and not 0 < seconds <= cfm.rand_noise.shape[2] / (token_rate * ratio):
        raise ConvertError(f"--noise-seconds {seconds:g}: the fixed noise covers 0 to "
                           f"{cfm.rand_noise.shape[2] / (token_rate * ratio):g} s")
    stages, flow_extra, streaming = (_cosyvoice3_stages(flow, hift, hop, tmp, seconds and int(seconds * sample_rate))
                                     if cosyvoice3 else _cosyvoice2_stages(ck, flow, hift, hop))
    files = _export(stages, tmp, precisions)
    if "incremental" in flow_extra:
        for section in (flow_extra["incremental"], flow_extra["incremental"].get("encoder")):
            if section is not None:
                section["files"] = files[section["files"]]
    frames = int(seconds * token_rate * ratio) if seconds else None
    np.save(tmp / "flow_noise.npy", cfm.rand_noise[0, :, :frames].float().numpy())
    tok = _tokenizer(ck, tmp)
    system = None
    frontend = {"tokenizer": "tokenizer.json"}
    if cosyvoice3:
        system = tok.encode(SYSTEM_PROMPT + END_OF_PROMPT, add_special_tokens=False).ids
        frontend["system_prompt"] = SYSTEM_PROMPT
        llm_spec |= {"bistream_prompt_head": tok.token_to_id(END_OF_PROMPT), "silent_tokens": SILENT_TOKENS,
                     "max_silent_run": MAX_SILENT_RUN}
    clips = options.voices or {}
    voices = [*clips, *(v for v in _voices(ck, tmp, ratio, system) if v not in clips)]
    if not voices:
        raise ConvertError(f"{ck.path('spk2info.pt')}: the checkpoint has no speakers (the file is missing or empty); "
                           "give the model a voice with --voice NAME=CLIP.wav:TRANSCRIPT")
    for f in ("campplus.onnx", ck.family.speech_tokenizer):
        shutil.copyfile(ck.path(f), tmp / f)
    manifest = {
        "format": "cosyvoice2-onnx/v1",
        "name": name,
        "family": ck.family.title,
        "description": f"Converted from the {ck.family.title} checkpoint '{ck.dir.name}' by cosyvoice-server convert.",
        "sample_rate": sample_rate,
        "token_rate": token_rate,
        "mel_rate": token_rate * ratio,
        "hop_samples": hop,
        "frontend": frontend,
        "llm": llm_spec,
        "flow": {
            "encoder": {"files": files["flow_encoder"]},
            "estimator": {"files": files["flow.decoder.estimator"]},
            "n_timesteps": 10,  # both families' flow.inference pass n_timesteps=10
            "cfg_rate": float(cfm.inference_cfg_rate),
            "pre_lookahead_tokens": int(flow.pre_lookahead_len),
            "noise": "flow_noise.npy",
            "mel_bins": int(flow.output_size),
            "spk_embed_dim": int(flow.spk_embed_affine_layer.in_features),
        } | flow_extra,
        "vocoder": {"files": files["hift"]} | ({"noise": "hift_noise.npy"} if cosyvoice3 else {}),
        "streaming": {"first_hop_tokens": TOKEN_HOP} | streaming,
        "voices": {"dir": "voices", "default": voices[0]} | ({"aliases": options.aliases} if options.aliases else {}),
        "prompt_encoders": {"campplus": "campplus.onnx", "speech_tokenizer": ck.family.speech_tokenizer, "mel_fmax": fmax},
    }
    (tmp / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True))
    for voice, (clip, transcript) in clips.items():
        _clip_voice(tmp, voice, clip, transcript)


def _clip_voice(model: Path, name: str, clip: Path, transcript: str | None) -> None:
    """voices/<name>.npz from a clip, computed by the converted model's prompt encoders as registration does."""
    from ..engine.pipeline import save_voice
    from ..frontend import TextFrontend
    from ..model.manifest import VOICE_NAME, load_manifest
    from ..voices.clip import ClipRejected, decode
    from ..voices.features import ClipError, PromptEncoder

    if not re.match(VOICE_NAME, name):
        raise ConvertError(f"--voice {name}=...: not a voice name (letters, digits, '_', '.', '-')")
    try:
        data = clip.read_bytes()
    except OSError as exc:
        raise ConvertError(f"--voice {name}={clip}: {exc.strerror or exc}") from exc
    m = load_manifest(model)
    try:
        c = decode(data, clip.name)
        voice = PromptEncoder(model, m, TextFrontend.of_model(model, m.frontend)).extract(c.audio, c.sample_rate,
                                                                                          transcript, name)
    except (ClipRejected, ClipError) as exc:
        raise ConvertError(f"--voice {name}={clip}: {exc.message}") from exc
    save_voice(model / m.voices.dir / f"{name}.npz", voice)
