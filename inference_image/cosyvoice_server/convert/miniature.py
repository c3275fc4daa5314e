"""Builds a random-weight checkpoint in the exact layout of the published CosyVoice2-0.5B or
Fun-CosyVoice3-0.5B directory.

CosyVoice2's uses upstream's own classes (`cosyvoice-minicpmo`), so the files are what upstream would load:
`cosyvoice2.yaml` in the shape upstream publishes it (every section: upstream_yaml.py), `llm.pt`,
`flow.pt`, `hift.pt` state dicts, `spk2info.pt` with SFT speakers, `CosyVoice-BlankEN/` (Qwen2 config, weights and a byte-level BPE tokenizer), and ONNX stand-ins
for `campplus.onnx` and `speech_tokenizer_v2.onnx` with the published interfaces. Rates are the real
ones (24 kHz, 25 tokens/s, 50 mel frames/s); layer sizes are small unless `size="full"`. CosyVoice3's
(`family="cosyvoice3"`) is built with the project's implementation of upstream's classes (dit_flow.py,
causal_hift.py, proven equal to upstream's outputs by tests/cosyvoice3) from `cosyvoice3.yaml` in upstream's
shape; its `spk2info.pt` holds zero-shot speakers whose prompt text starts with the system prompt, as
upstream's examples register them.

    python -m cosyvoice_server.convert.miniature --out /tmp/ckpt [--family cosyvoice3] [--size mini|full] [--seed 0]

Tests convert it and compare the engine against upstream's inference on the same weights.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import upstream_yaml


@dataclass(frozen=True)
class Size:
    qwen_hidden: int
    qwen_layers: int
    qwen_heads: int
    qwen_kv_heads: int
    qwen_mlp: int
    encoder_blocks: int  # the encoder width is 512 in upstream's PreLookaheadLayer and Upsample1D
    encoder_heads: int
    encoder_units: int
    est_channels: int
    est_head_dim: int
    est_heads: int
    est_blocks: int
    est_mid_blocks: int
    hift_channels: int
    hift_res_kernels: tuple[int, ...]
    f0_channels: int
    dit_dim: int = 64  # CosyVoice3's flow
    dit_depth: int = 2
    dit_heads: int = 2
    dit_head_dim: int = 32
    lookahead_channels: int = 64
    speakers: tuple[str, ...] = ("spk_a", "spk_b")
    sft_speakers: int = 1  # CosyVoice2: the first ones are SFT speakers (an embedding only), the rest zero-shot
    eos_bias: float = 0.0  # added to the eos logit so random weights stop at plausible lengths
    speech_tokens: int = 6561  # the speech vocabulary (the released models': 6561)
    qwen_ids: bool = True  # CosyVoice3: special tokens at Qwen2.5's ids, as upstream's code expects (a 151936-row
    # text embedding); False: right after the miniature's own small vocabulary


SIZES = {
    "mini": Size(qwen_hidden=64, qwen_layers=2, qwen_heads=4, qwen_kv_heads=2, qwen_mlp=128,
                 encoder_blocks=1, encoder_heads=8, encoder_units=256,
                 est_channels=64, est_head_dim=16, est_heads=2, est_blocks=1, est_mid_blocks=1,
                 hift_channels=32, hift_res_kernels=(3,), f0_channels=32, eos_bias=6.0),
    # CosyVoice2-0.5B's sizes (examples/libritts/cosyvoice2/conf/cosyvoice2.yaml), for timing a converted model.
    "full": Size(qwen_hidden=896, qwen_layers=24, qwen_heads=14, qwen_kv_heads=2, qwen_mlp=4864,
                 encoder_blocks=6, encoder_heads=8, encoder_units=2048,
                 est_channels=256, est_head_dim=64, est_heads=8, est_blocks=4, est_mid_blocks=12,
                 hift_channels=512, hift_res_kernels=(3, 7, 11), f0_channels=512, dit_dim=1024, dit_depth=22,
                 dit_heads=16, dit_head_dim=64, lookahead_channels=1024, eos_bias=6.0),
}
# CosyVoice3's miniature: the golden checkpoint's sizes (tests/cosyvoice3), its vocoder with all three kernels
MINI3 = Size(qwen_hidden=64, qwen_layers=2, qwen_heads=4, qwen_kv_heads=2, qwen_mlp=128, encoder_blocks=1,
             encoder_heads=8, encoder_units=256, est_channels=64, est_head_dim=16, est_heads=2, est_blocks=1,
             est_mid_blocks=1, hift_channels=64, hift_res_kernels=(3, 7, 11), f0_channels=64, eos_bias=6.0)

SPEECH_TOKENS = 6561  # the released models' speech vocabulary
CONFIGS = ("current", "earlier")  # upstream's CosyVoice2 example config now and before its streaming settings
FAMILIES = ("cosyvoice2", "cosyvoice3")
MODEL_KEYS = ("llm", "flow", "hift")


def _yaml_sizes(s: Size) -> upstream_yaml.Sizes:
    return upstream_yaml.Sizes(
        llm_hidden=s.qwen_hidden, speech_tokens=s.speech_tokens, encoder_heads=s.encoder_heads,
        encoder_units=s.encoder_units, encoder_blocks=s.encoder_blocks, est_channels=s.est_channels,
        est_head_dim=s.est_head_dim, est_blocks=s.est_blocks, est_mid_blocks=s.est_mid_blocks, est_heads=s.est_heads,
        hift_channels=s.hift_channels, hift_res_kernels=s.hift_res_kernels, f0_channels=s.f0_channels, dit_dim=s.dit_dim,
        dit_depth=s.dit_depth, dit_heads=s.dit_heads, dit_head_dim=s.dit_head_dim, lookahead_channels=s.lookahead_channels)


def config_text(s: Size, config: str = "current") -> str:
    """The checkpoint's cosyvoice2.yaml: upstream's whole config (training sections included) at size `s`."""
    return upstream_yaml.cosyvoice2(_yaml_sizes(s), streaming_params=config == "current")


def upstream_modules(yaml_text: str, blank: Path) -> dict:
    """llm, flow and hift built by upstream's own loader (hyperpyyaml), as `CosyVoice2` builds them. The
    training sections (data pipeline, GAN discriminators) are dropped first: loading them imports training
    code (pyarrow, torchaudio, pyworld) that inference does not need."""
    import io

    from hyperpyyaml import load_hyperpyyaml
    from ruamel.yaml import YAML

    rt = YAML()  # round trip: tags stay as written
    doc = rt.load(yaml_text)
    for key in list(doc):
        tagged = getattr(getattr(doc[key], "tag", None), "value", None)
        if key not in MODEL_KEYS and (tagged or isinstance(doc[key], (dict, list))):
            del doc[key]
    buf = io.StringIO()
    rt.dump(doc, buf)
    return load_hyperpyyaml(buf.getvalue(), overrides={"qwen_pretrain_path": str(blank)})


_CORPUS = ("Hello world. This is a small test of speech synthesis, with numbers 1 2 3 and punctuation! "
           "The quick brown fox jumps over the lazy dog? Streaming text to speech, chunk by chunk.")


QWEN_TEXT_TOKENS = 151643  # Qwen2.5's ordinary vocabulary: <|endoftext|> is 151643, <|endofprompt|> becomes 151646


def _tokenizer_files(out: Path, pad_to: int | None = None) -> int:
    """A byte-level BPE tokenizer saved as Qwen2TokenizerFast files (vocab.json, merges.txt, tokenizer.json).
    `pad_to`: filler entries (never produced) bring the vocabulary to that size, so the special tokens get
    Qwen2.5's ids, which upstream's CosyVoice3LM takes <|endofprompt|> to be (151646, hard-coded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[] if pad_to else ["<|endoftext|>"])
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    specials = {}
    if pad_to:
        trained = json.loads(tok.to_str())["model"]
        vocab = dict(trained["vocab"])
        vocab |= {f"\u010a\u010a\u010afill{i}": i for i in range(len(vocab), pad_to)}
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
        padded = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        padded.pre_tokenizer, padded.decoder = tok.pre_tokenizer, tok.decoder
        padded.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tok = padded
        specials = {"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                              unk_token=None, bos_token=None, **specials)
    fast.save_pretrained(str(out))
    return len(fast)


def _onnx_stand_ins(out: Path, rng: np.random.Generator, speech_tokens: int = SPEECH_TOKENS,
                    tokenizer_file: str = "speech_tokenizer_v2.onnx") -> None:
    """campplus.onnx: fbank [1,T,80] -> embedding [1,192]; the speech tokenizer: log-mel [1,128,T] and
    its length -> token ids [1,T/4] (the published input and output names)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((80, 192)).astype(np.float32) * 0.1, "w")
    # the RMS of each bin over time: the frontend feeds mean-normalised fbank, whose plain mean is zero
    g = helper.make_graph(
        [helper.make_node("Mul", ["input", "input"], ["sq"]),
         helper.make_node("ReduceMean", ["sq", "axes"], ["m"], keepdims=0),
         helper.make_node("Sqrt", ["m"], ["rms"]),
         helper.make_node("MatMul", ["rms", "w"], ["output"])],
        "campplus", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 192])],
        [w, numpy_helper.from_array(np.array([1], np.int64), "axes")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(out / "campplus.onnx"))
    proj = numpy_helper.from_array(rng.standard_normal((128, 1)).astype(np.float32), "p")
    g = helper.make_graph(
        [helper.make_node("Transpose", ["feats"], ["t"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["t", "p"], ["s"]),
         helper.make_node("Squeeze", ["s", "ax2"], ["s2"]),
         helper.make_node("Slice", ["s2", "zero", "big", "one", "four"], ["s4"]),
         helper.make_node("Abs", ["s4"], ["a"]),
         helper.make_node("Mul", ["a", "scale"], ["b"]),
         helper.make_node("Cast", ["b"], ["c"], to=TensorProto.INT64),
         helper.make_node("Mod", ["c", "vocab"], ["tok"]),
         helper.make_node("Cast", ["tok"], ["indices"], to=TensorProto.INT32)],
        "speech_tokenizer",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("indices", TensorProto.INT32, [1, "N"])],
        [proj, numpy_helper.from_array(np.array([2], np.int64), "ax2"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([2**62], np.int64), "big"),
         numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array([4], np.int64), "four"),
         numpy_helper.from_array(np.float32(1000.0), "scale"), numpy_helper.from_array(np.int64(speech_tokens), "vocab")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(out / tokenizer_file))


def build(out: Path, size: str = "mini", seed: int = 0, config: str = "current", family: str = "cosyvoice2") -> Path:
    """Writes the checkpoint directory and returns it."""
    if family == "cosyvoice3":
        return build_cosyvoice3(out, MINI3 if size == "mini" else SIZES[size], seed)
    return build_cosyvoice2(out, SIZES[size], seed, config)


def build_cosyvoice2(out: Path, s: Size, seed: int = 0, config: str = "current") -> Path:
    """A CosyVoice2 checkpoint directory at sizes `s` (upstream's classes, layout and yaml)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from . import upstream

    upstream.load()
    out.mkdir(parents=True, exist_ok=True)
    blank = out / "CosyVoice-BlankEN"
    blank.mkdir(exist_ok=True)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    text_vocab = _tokenizer_files(blank)
    cfg = Qwen2Config(vocab_size=text_vocab + 32, hidden_size=s.qwen_hidden, intermediate_size=s.qwen_mlp,
                      num_hidden_layers=s.qwen_layers, num_attention_heads=s.qwen_heads,
                      num_key_value_heads=s.qwen_kv_heads, max_position_embeddings=4096, rope_theta=1e6,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="float32")
    Qwen2ForCausalLM(cfg).save_pretrained(str(blank))  # BlankEN ships weights too; upstream's llm.pt overrides them

    yaml_text = config_text(s, config)
    (out / "cosyvoice2.yaml").write_text(yaml_text)
    configs = upstream_modules(yaml_text, blank)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name in ("llm", "flow", "hift"):
            module = configs[name]
            for p in module.parameters():  # upstream's init leaves some tensors zero; random everywhere is a harder test
                p.add_(torch.randn_like(p) * 0.02)
        configs["llm"].llm_decoder.bias[s.speech_tokens] += s.eos_bias
        configs["llm"].llm_decoder.bias[s.speech_tokens + 1:] -= 10.0  # fill tokens: bistream only, as trained
        torch.save(configs["llm"].state_dict(), out / "llm.pt")
        torch.save(configs["flow"].state_dict(), out / "flow.pt")
        torch.save(configs["hift"].state_dict(), out / "hift.pt")

    # spk2info.pt as upstream writes it: SFT speakers carry only an embedding (`frontend_sft`); a speaker
    # saved by `add_zero_shot_spk` carries the whole zero-shot model input.
    spk2info = {name: {"embedding": torch.randn(1, 192)} for name in s.speakers[: s.sft_speakers]}
    for name in s.speakers[s.sft_speakers:]:
        n = 17
        emb = torch.randn(1, 192)
        text = torch.randint(0, text_vocab, (1, 6), dtype=torch.int32)
        tokens = torch.randint(0, s.speech_tokens, (1, n), dtype=torch.int32)
        spk2info[name] = {
            "prompt_text": text, "prompt_text_len": torch.tensor([6], dtype=torch.int32),
            "llm_prompt_speech_token": tokens, "llm_prompt_speech_token_len": torch.tensor([n], dtype=torch.int32),
            "flow_prompt_speech_token": tokens, "flow_prompt_speech_token_len": torch.tensor([n], dtype=torch.int32),
            "prompt_speech_feat": torch.randn(1, 2 * n, 80) * 0.5, "prompt_speech_feat_len": torch.tensor([2 * n], dtype=torch.int32),
            "llm_embedding": emb, "flow_embedding": emb,
        }
    torch.save(spk2info, out / "spk2info.pt")
    _onnx_stand_ins(out, rng, s.speech_tokens)
    (out / "configuration.json").write_text(json.dumps({"framework": "Pytorch", "task": "text-to-speech"}) + "\n")
    return out


def _qwen(blank: Path, s: Size, text_vocab: int, extra: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=text_vocab + extra, hidden_size=s.qwen_hidden, intermediate_size=s.qwen_mlp,
                      num_hidden_layers=s.qwen_layers, num_attention_heads=s.qwen_heads,
                      num_key_value_heads=s.qwen_kv_heads, max_position_embeddings=4096, rope_theta=1e6,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="float32")
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(str(blank))  # BlankEN ships weights too; upstream's llm.pt overrides them
    return model


def _length_control(qwen, state: dict, speech: int, tokens_per_text: float = 4.0) -> None:
    """CosyVoice3LM's head has no bias and only one of its 200 stop tokens is masked before min_len, so random
    weights would stop anywhere. These weights make the end of speech follow the text's length, as a trained
    model's does: channel 0 of the residual stream holds a constant and channel 1 marks text positions (every
    embedding row sets them; no layer reads or writes channels 0-2 but this); the first layer's head 0 attends
    to every position alike and averages channel 1 into channel 2: the share of text among the positions so
    far, which falls as speech tokens follow. The head turns the two into an end-of-speech logit that crosses
    zero where `tokens_per_text` speech tokens follow each text token, and keeps the other stop tokens low."""
    import torch

    q = qwen.config
    d = q.hidden_size // q.num_attention_heads
    body = "llm.model.model."
    for key in state:
        t = state[key]
        if key.endswith(("embed_tokens.weight", "speech_embedding.weight")):
            t[:, 0] = 1.0
            t[:, 1] = 1.0 if "embed_tokens" in key else 0.0
            t[:, 2] = 0.0
        elif key.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
            t[:, :3] = 0.0
        elif key.endswith(("o_proj.weight", "down_proj.weight")):
            t[:3, :] = 0.0
    layer = body + "layers.0.self_attn."
    state[layer + "q_proj.weight"][:d] = 0.0  # head 0: equal scores, so it averages over the positions it sees
    state[layer + "q_proj.bias"][:d] = 0.0
    state[layer + "v_proj.weight"][0] = 0.0
    state[layer + "v_proj.weight"][0, 1] = 1.0  # its first value dimension reads the text mark
    state[layer + "v_proj.bias"][0] = 0.0
    state[layer + "o_proj.weight"][:, 0] = 0.0
    state[layer + "o_proj.weight"][2, 0] = 1.0  # ... and writes into channel 2
    # What channels 0 and 2 read after the final norm for a text share f: calibrated on the model itself.
    qwen.load_state_dict({k[len("llm.model."):]: v for k, v in state.items() if k.startswith("llm.model.")})
    text = state[body + "embed_tokens.weight"][:40]
    sp = state["speech_embedding.weight"][:240]

    def channels(n_speech: int) -> tuple[float, float]:
        x = torch.cat([text, sp[:n_speech]]).unsqueeze(0)
        with torch.no_grad():
            h = qwen.model(inputs_embeds=x).last_hidden_state[0, -1]
        return float(h[0]), float(h[2])

    (c0, lo), (_, hi) = channels(int(40 * tokens_per_text * 1.5)), channels(int(40 * tokens_per_text * 0.5))
    mid = (lo + hi) / 2
    head = state["llm_decoder.weight"]
    head[:, :3] = 0.0
    scale = 8.0 / (hi - lo)  # the logit moves by 8 between half and one and a half times the target length
    head[speech + 1, 2] = -scale
    head[speech + 1, 0] = scale * mid / c0
    head[speech + 2 :, 0] = -10.0 / c0


def build_cosyvoice3(out: Path, s: Size, seed: int = 0) -> Path:
    """A CosyVoice3 checkpoint directory at sizes `s` (the project's modules; upstream's layout and yaml)."""
    import torch
    from transformers import AutoTokenizer

    from . import build as builder
    from . import hyperyaml, tokens

    out.mkdir(parents=True, exist_ok=True)
    blank = out / "CosyVoice-BlankEN"
    blank.mkdir(exist_ok=True)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    text_vocab = _tokenizer_files(blank, pad_to=QWEN_TEXT_TOKENS if s.qwen_ids else None)
    # Qwen2.5's embedding rows, as upstream's checkpoints; else room for the special tokens after the vocabulary
    qwen = _qwen(blank, s, text_vocab, 151936 - text_vocab if s.qwen_ids else len(tokens.COSYVOICE3) + 32)
    yaml_text = upstream_yaml.cosyvoice3(_yaml_sizes(s))
    path = out / "cosyvoice3.yaml"
    path.write_text(yaml_text)
    cfg = hyperyaml.resolve(hyperyaml.parse(yaml_text, path), {"qwen_pretrain_path": str(blank)}, path)
    table = builder.TABLES["cosyvoice3"]
    flow, hift = builder.build(cfg["flow"], path, table), builder.build(cfg["hift"], path, table)
    torch.manual_seed(seed)
    speech, h = s.speech_tokens, s.qwen_hidden
    with torch.no_grad():
        llm = {f"llm.model.{k}": v for k, v in qwen.state_dict().items()}  # lm_head shares embed_tokens' storage
        llm["speech_embedding.weight"] = torch.randn(speech + 200, h) * 0.5
        llm["llm_decoder.weight"] = torch.randn(speech + 200, h) * 0.02
        for t in {t.data_ptr(): t for t in llm.values()}.values():  # random everywhere is a harder test
            t.add_(torch.randn_like(t) * 0.02)
        _length_control(qwen, llm, speech)
        for module in (flow, hift):
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        torch.save(llm, out / "llm.pt")
        torch.save(flow.state_dict(), out / "flow.pt")
        torch.save(hift.state_dict(), out / "hift.pt")
    tok = AutoTokenizer.from_pretrained(str(blank))
    tok.add_special_tokens(tokens.special_tokens("cosyvoice3"))
    spk2info = {}
    for i, name in enumerate(s.speakers):
        n = 17 + 13 * i  # one prompt shorter than a chunk, one longer
        emb = torch.randn(1, 192)
        text = torch.tensor([tok.encode(f"You are a helpful assistant.<|endofprompt|>hello there number {i}.")],
                            dtype=torch.int32)
        toks = torch.randint(0, speech, (1, n), dtype=torch.int32)
        spk2info[name] = {
            "prompt_text": text, "prompt_text_len": torch.tensor([text.shape[1]], dtype=torch.int32),
            "llm_prompt_speech_token": toks, "llm_prompt_speech_token_len": torch.tensor([n], dtype=torch.int32),
            "flow_prompt_speech_token": toks, "flow_prompt_speech_token_len": torch.tensor([n], dtype=torch.int32),
            "prompt_speech_feat": torch.randn(1, 2 * n, 80) * 0.5, "prompt_speech_feat_len": torch.tensor([2 * n], dtype=torch.int32),
            "llm_embedding": emb, "flow_embedding": emb,
        }
    torch.save(spk2info, out / "spk2info.pt")
    _onnx_stand_ins(out, rng, speech, tokenizer_file="speech_tokenizer_v3.onnx")
    (out / "configuration.json").write_text(json.dumps({"framework": "Pytorch", "task": "text-to-speech"}) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="mini")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", choices=CONFIGS, default="current",
                    help="upstream's CosyVoice2 example config: current (encoder streams in chunks) or earlier (it does not)")
    ap.add_argument("--family", choices=FAMILIES, default="cosyvoice2")
    args = ap.parse_args(argv)
    print(build(Path(args.out), args.size, args.seed, args.config, args.family))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
