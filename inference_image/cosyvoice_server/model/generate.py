"""Builds random-weight models with CosyVoice2's stage graph, tensor names and rates.

`tiny` is the bundled model (a few MB, committed, used by `make demo` and the tests). Its weights are
random, so its audio is noise-like: it exercises every stage, shape and scheduling path of a real
CosyVoice2 export, not speech quality. The output is deterministic: the same preset and seed give
the same bytes.

    cosyvoice-server generate-model --preset tiny --out models/tiny
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import yaml

from .graph import GraphBuilder, i64

SAMPLE_RATE = 24000
MEL_BINS = 80
HOP_SAMPLES = 480  # one mel frame; 2 frames per speech token -> 960 samples per token
SPK_DIM = 192
HARMONICS = 9  # HiFT's source: the fundamental and 8 harmonics


@dataclass(frozen=True)
class Preset:
    name: str
    # LLM (Qwen2-style decoder)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    speech_vocab: int
    rope_theta: float
    eos_bias: float
    # flow encoder: transformer blocks at the token rate, then after the x2 upsampling
    enc_dim: int
    enc_blocks: int
    enc_up_blocks: int
    enc_heads: int
    enc_ff: int
    # flow-matching estimator: resnet blocks, each followed by transformer blocks
    est_channels: int
    est_resnets: int
    est_transformers: int
    est_heads: int
    est_head_dim: int
    est_ff: int
    est_kernel: int  # temporal kernel of the estimator's convolutions
    # vocoder: conv_pre channels, then x8, x5, x3 upsampling (kernels 16, 11, 7) and a x4 sub-pixel stage
    voc_channels: tuple[int, int, int, int]
    voc_res_kernels: tuple[int, ...]
    voc_dilations: tuple[int, ...]
    first_hop_tokens: int = 25
    max_hop_tokens: int = 100
    max_text_tokens_per_segment: int = 80
    n_timesteps: int = 10
    fp16: bool = True
    # Flow noise buffer length in mel frames (upstream's is 15000, 300 s); it bounds one segment's audio.
    noise_frames: int = 15000
    external_data: bool = False  # weights beside the graph (needed past protobuf's 2 GB)


PRESETS = {
    # Every stage and tensor name of the real model at a size where per-call overhead, not arithmetic,
    # dominates: what the CPU tests and the scheduling benchmark are meant to see.
    "tiny": Preset(
        name="cosyvoice2-tiny",
        hidden=64, layers=2, heads=4, kv_heads=2, mlp=128, speech_vocab=512, rope_theta=1e6, eos_bias=2.0,
        enc_dim=16, enc_blocks=1, enc_up_blocks=1, enc_heads=2, enc_ff=32,
        est_channels=16, est_resnets=1, est_transformers=1, est_heads=2, est_head_dim=8, est_ff=32, est_kernel=1,
        voc_channels=(32, 16, 8, 4), voc_res_kernels=(3,), voc_dilations=(1,),
        noise_frames=4000,  # 80 s: above the longest segment (80 text tokens x 20 speech tokens x 2 frames)
    ),
    # CosyVoice2-0.5B's layer sizes (FIELD: Qwen2-0.5B body, UpsampleConformerEncoder 512/8 heads/6+4 blocks,
    # CausalConditionalDecoder 256 channels with 4 + 12 x 4 transformer blocks, HiFT 512 base channels).
    # Random weights: for measuring realistic compute per token and per chunk on a GPU, never committed.
    "cosyvoice2": Preset(
        name="cosyvoice2-random-fullsize",
        hidden=896, layers=24, heads=14, kv_heads=2, mlp=4864, speech_vocab=6561, rope_theta=1e6, eos_bias=2.0,
        enc_dim=512, enc_blocks=6, enc_up_blocks=4, enc_heads=8, enc_ff=2048,
        est_channels=256, est_resnets=14, est_transformers=4, est_heads=8, est_head_dim=64, est_ff=1024, est_kernel=3,
        voc_channels=(512, 256, 128, 64), voc_res_kernels=(3, 7, 11), voc_dilations=(1, 3, 5),
        external_data=True,
    ),
}

SPECIAL_TOKENS = 3  # CosyVoice2 speech vocabulary: tokens, then eos (= speech_vocab) and two fill tokens


class _Init:
    """Deterministic weight source: each tensor draws from one seeded generator in build order."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def w(self, *shape: int, fan_in: int | None = None) -> np.ndarray:
        fan = fan_in if fan_in is not None else shape[0]
        return (self.rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32)

    def zeros(self, *shape: int) -> np.ndarray:
        return np.zeros(shape, np.float32)


@dataclass(frozen=True)
class LLMShape:
    """A Qwen2 decoder with a speech head: what the LLM graph builder needs to know."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    speech_vocab: int  # eos = speech_vocab; the head has `special` more outputs
    rope_theta: float = 1e6
    rms_eps: float = 1e-6
    special: int = SPECIAL_TOKENS  # CosyVoice3LM's head has 200
    decoder_bias: bool = True  # CosyVoice3LM's llm_decoder has none

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def vocab(self) -> int:
        return self.speech_vocab + self.special


# A weight source: (name, shape) -> array. Linear weights are [in, out]. Names: layers.{i}.{q,k,v,o}_proj.weight,
# layers.{i}.{q,k,v}_proj.bias, layers.{i}.{gate,up,down}_proj.weight, layers.{i}.input_layernorm.weight,
# layers.{i}.post_attention_layernorm.weight, norm.weight, llm_decoder.weight, llm_decoder.bias.
Weights = Callable[[str, tuple[int, ...]], np.ndarray]


def _random_llm_weights(p: Preset, init: _Init) -> Weights:
    def weight(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name.endswith("norm.weight"):
            return np.ones(shape, np.float32)
        if name == "llm_decoder.bias":
            bias = init.zeros(*shape)
            # Random weights never choose to stop; a fixed bias on eos gives utterances of plausible length.
            # The fill tokens after it stop a sequence too; trained models rarely emit them outside bistream mode.
            bias[p.speech_vocab] = p.eos_bias
            bias[p.speech_vocab + 1 :] = -10.0
            return bias
        if name.endswith(".bias"):
            return init.zeros(*shape)
        return init.w(*shape)

    return weight


def build_llm(s: LLMShape, weight: Weights) -> onnx.ModelProto:
    """One Qwen2 decoder forward over new positions with a KV cache; returns last-position logits of the
    speech head (`llm_decoder`).

    Inputs: inputs_embeds[B,S,H], attention_mask[B,P+S] (1 = real, 0 = left padding),
    position_ids[B,S], past_key_values.{i}.key/value[B,kv_heads,P,head_dim].
    Outputs: logits[B,V], present.{i}.key/value[B,kv_heads,P+S,head_dim].
    """
    head_dim = s.head_dim
    rep = s.heads // s.kv_heads
    g = GraphBuilder("llm")
    x = g.input("inputs_embeds", "float32", ["batch", "seq", s.hidden])
    am = g.input("attention_mask", "int64", ["batch", "total"])
    pos = g.input("position_ids", "int64", ["batch", "seq"])
    pasts = []
    for i in range(s.layers):
        pasts.append(
            (
                g.input(f"past_key_values.{i}.key", "float32", ["batch", s.kv_heads, "past", head_dim]),
                g.input(f"past_key_values.{i}.value", "float32", ["batch", s.kv_heads, "past", head_dim]),
            )
        )

    # Additive mask [B,1,S,T]: causal over absolute positions, and left padding masked out.
    total = g.op("Squeeze", [g.shape_of(am, 1, 2)])
    seq = g.op("Squeeze", [g.shape_of(x, 1, 2)])
    past_len = g.op("Sub", [total, seq])
    k_idx = g.op("Range", [g.const(np.int64(0)), total, g.const(np.int64(1))])
    q_idx = g.op("Add", [g.op("Range", [g.const(np.int64(0)), seq, g.const(np.int64(1))]), past_len])
    causal = g.op("LessOrEqual", [g.op("Unsqueeze", [k_idx, g.const(i64(0))]), g.op("Unsqueeze", [q_idx, g.const(i64(1))])])
    pad_ok = g.op("Unsqueeze", [g.op("Cast", [am], to=onnx.TensorProto.BOOL), g.const(i64(1, 2))])
    allowed = g.op("And", [causal, pad_ok])
    mask_add = g.op("Where", [allowed, g.const(np.float32(0.0)), g.const(np.float32(-1e4))])

    # Rotary embeddings from per-row positions (rows of a batch are at different positions). inv_freq is
    # computed in float32 as transformers' Qwen2 does, so angles agree at long positions.
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / np.power(np.float32(s.rope_theta), exponents, dtype=np.float32)).astype(np.float32)
    posf = g.op("Unsqueeze", [g.op("Cast", [pos], to=onnx.TensorProto.FLOAT), g.const(i64(-1))])
    freqs = g.op("Mul", [posf, g.const(inv_freq)])
    emb = g.op("Unsqueeze", [g.op("Concat", [freqs, freqs], axis=-1), g.const(i64(1))])
    cos, sin = g.op("Cos", [emb]), g.op("Sin", [emb])

    def rope(t: str) -> str:
        a, b = g.op("Split", [t], n_out=2, axis=-1, num_outputs=2)
        rotated = g.op("Concat", [g.op("Neg", [b]), a], axis=-1)
        return g.op("Add", [g.op("Mul", [t, cos]), g.op("Mul", [rotated, sin])])

    def heads(t: str, n: int) -> str:
        return g.op("Transpose", [g.op("Reshape", [t, g.const(i64(0, 0, n, head_dim))])], perm=[0, 2, 1, 3])

    def repeat_kv(t: str) -> str:
        # [B,kv,T,d] -> [B,kv*rep,T,d] (grouped-query attention, as Qwen2)
        shp = g.op("Concat", [g.shape_of(t, 0, 2), g.const(i64(rep)), g.shape_of(t, 2, 4)], axis=0)
        expanded = g.op("Expand", [g.op("Unsqueeze", [t, g.const(i64(2))]), shp])
        return g.op("Reshape", [expanded, g.const(i64(0, s.heads, -1, head_dim))])

    def linear(x: str, name: str, n_in: int, n_out: int, bias: bool) -> str:
        w = weight(f"{name}.weight", (n_in, n_out))
        return g.linear(x, w, weight(f"{name}.bias", (n_out,)) if bias else None, name)

    def norm(x: str, name: str) -> str:
        return g.rms_norm(x, weight(f"{name}.weight", (s.hidden,)), name, eps=s.rms_eps)

    h = x
    kv_dim = s.kv_heads * head_dim
    for i in range(s.layers):
        hn = norm(h, f"layers.{i}.input_layernorm")
        q = rope(heads(linear(hn, f"layers.{i}.q_proj", s.hidden, s.hidden, True), s.heads))
        k = rope(heads(linear(hn, f"layers.{i}.k_proj", s.hidden, kv_dim, True), s.kv_heads))
        v = heads(linear(hn, f"layers.{i}.v_proj", s.hidden, kv_dim, True), s.kv_heads)
        pk = g.op("Concat", [pasts[i][0], k], axis=2)
        pv = g.op("Concat", [pasts[i][1], v], axis=2)
        g.output(pk, f"present.{i}.key", "float32", ["batch", s.kv_heads, "total", head_dim])
        g.output(pv, f"present.{i}.value", "float32", ["batch", s.kv_heads, "total", head_dim])
        scores = g.op("MatMul", [q, g.op("Transpose", [repeat_kv(pk)], perm=[0, 1, 3, 2])])
        scores = g.op("Add", [g.op("Mul", [scores, g.const(np.float32(1.0 / np.sqrt(head_dim)))]), mask_add])
        attn = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), repeat_kv(pv)])
        attn = g.op("Reshape", [g.op("Transpose", [attn], perm=[0, 2, 1, 3]), g.const(i64(0, 0, -1))])
        h = g.op("Add", [h, linear(attn, f"layers.{i}.o_proj", s.hidden, s.hidden, False)])
        hn = norm(h, f"layers.{i}.post_attention_layernorm")
        gate = linear(hn, f"layers.{i}.gate_proj", s.hidden, s.mlp, False)
        up = linear(hn, f"layers.{i}.up_proj", s.hidden, s.mlp, False)
        h = g.op("Add", [h, linear(g.op("Mul", [g.silu(gate), up]), f"layers.{i}.down_proj", s.mlp, s.hidden, False)])
    h = norm(h, "norm")
    last = g.op("Squeeze", [g.op("Slice", [h, g.const(i64(-1)), g.const(i64(2**62)), g.const(i64(1))]), g.const(i64(1))])
    logits = linear(last, "llm_decoder", s.hidden, s.vocab, s.decoder_bias)
    g.output(logits, "logits", "float32", ["batch", s.vocab])
    return g.model("CosyVoice2 LLM decoder step with KV cache")


def _random_llm(p: Preset, init: _Init) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    shape = LLMShape(p.hidden, p.layers, p.heads, p.kv_heads, p.mlp, p.speech_vocab, p.rope_theta)
    model = build_llm(shape, _random_llm_weights(p, init))
    # Embedding tables stay outside the graph (numpy lookups on the host): a real Qwen2 text table is
    # 151936 x 896 and would otherwise be copied into every step's graph inputs.
    weights = {
        "text_embedding": init.w(256, p.hidden, fan_in=1) * 0.5,
        "speech_embedding": init.w(shape.vocab, p.hidden, fan_in=1) * 0.5,
        "llm_embedding": init.w(2, p.hidden, fan_in=1) * 0.5,  # sos, task_id
    }
    return model, weights


def build_flow_encoder(p: Preset, init: _Init) -> onnx.ModelProto:
    """Speech tokens (+ pre-lookahead context tokens) -> mu[B,80,2N] (token_mel_ratio 2, zero past
    2 x token_len), speaker embedding -> spks[B,80]; streaming rows use chunk attention masks."""
    d = p.enc_dim
    g = GraphBuilder("flow_encoder")
    tok = g.input("token", "int64", ["batch", "tokens"])
    tok_len = g.input("token_len", "int64", ["batch"])
    ctx_len = g.input("context_len", "int64", ["batch"])
    streaming = g.input("streaming", "int64", ["batch"])
    spk = g.input("embedding", "float32", ["batch", SPK_DIM])
    n = g.op("Squeeze", [g.shape_of(tok, 1, 2)])
    pos = g.op("Unsqueeze", [g.op("Range", [g.const(np.int64(0)), n, g.const(np.int64(1))]), g.const(i64(0))])

    def below(length: str) -> str:  # [B,1,N] float mask of positions < length
        valid = g.op("Less", [pos, g.op("Unsqueeze", [length, g.const(i64(1))])])
        return g.op("Unsqueeze", [g.op("Cast", [valid], to=onnx.TensorProto.FLOAT), g.const(i64(1))])

    maskf = below(tok_len)
    emb = g.op("Gather", [g.const(init.w(p.speech_vocab + SPECIAL_TOKENS, d, fan_in=1) * 0.5, "input_embedding"), tok])
    h = g.op("Mul", [g.op("Transpose", [emb], perm=[0, 2, 1]), below(g.op("Add", [tok_len, ctx_len]))])  # [B,D,N]
    # Pre-lookahead: each token also sees the next 3 (the context tokens at a chunk's end), pad on the right.
    la = g.op("Pad", [h, g.const(i64(0, 0, 0, 0, 0, 3))])
    la = g.op("LeakyRelu", [g.op("Conv", [la, g.const(init.w(d, d, 4, fan_in=4 * d), "pre_lookahead.weight"),
                                          g.const(init.zeros(d), "pre_lookahead.bias")])], alpha=0.01)
    h = g.op("Add", [h, la])

    def blocks(h: str, mask: str, count: int, hint: str, chunk: int) -> str:
        x = g.op("Transpose", [h], perm=[0, 2, 1])
        key = g.chunk_key_mask(mask, streaming, chunk)
        for i in range(count):
            x = g.transformer_block(x, key, d, p.enc_heads, d // p.enc_heads, p.enc_ff, init.w, f"{hint}.{i}")
        return g.op("Mul", [g.op("Transpose", [x], perm=[0, 2, 1]), mask])

    h = blocks(h, maskf, p.enc_blocks, "encoders", p.first_hop_tokens)
    # Upsample x2 to the mel frame rate.
    up_shape = g.op("Concat", [g.shape_of(h, 0, 3), g.const(i64(2))], axis=0)
    h = g.op("Reshape", [g.op("Expand", [g.op("Unsqueeze", [h, g.const(i64(3))]), up_shape]), g.const(i64(0, 0, -1))])
    m2 = g.op("Reshape", [g.op("Expand", [g.op("Unsqueeze", [maskf, g.const(i64(3))]),
                                           g.op("Concat", [g.shape_of(maskf, 0, 3), g.const(i64(2))], axis=0)]),
                          g.const(i64(0, 0, -1))])
    h = blocks(h, m2, p.enc_up_blocks, "up_encoders", 2 * p.first_hop_tokens)
    mu = g.op("Mul", [g.conv1d(h, init.w(MEL_BINS, d, 1, fan_in=d), init.zeros(MEL_BINS), 0, "encoder_proj"), m2])
    g.output(mu, "mu", "float32", ["batch", MEL_BINS, "frames"])
    spk_n = g.op("LpNormalization", [spk], axis=1, p=2)
    spks = g.linear(spk_n, init.w(SPK_DIM, MEL_BINS, fan_in=1) * 0.2, init.zeros(MEL_BINS), "spk_embed_affine_layer")
    g.output(spks, "spks", "float32", ["batch", MEL_BINS])
    return g.model("CosyVoice2-style flow token encoder (random weights)")


def build_estimator(p: Preset, init: _Init) -> onnx.ModelProto:
    """The flow-matching estimator with CosyVoice's export names: x, mask, mu, t, spks, cond -> estimator_out,
    plus streaming[B] (chunk attention masks)."""
    c, k = p.est_channels, p.est_kernel
    g = GraphBuilder("estimator")
    x = g.input("x", "float32", ["batch", MEL_BINS, "frames"])
    mask = g.input("mask", "float32", ["batch", 1, "frames"])
    mu = g.input("mu", "float32", ["batch", MEL_BINS, "frames"])
    t = g.input("t", "float32", ["batch"])
    spks = g.input("spks", "float32", ["batch", MEL_BINS])
    cond = g.input("cond", "float32", ["batch", MEL_BINS, "frames"])
    streaming = g.input("streaming", "int64", ["batch"])
    spk_b = g.op("Expand", [g.op("Unsqueeze", [spks, g.const(i64(2))]), g.op("Shape", [x])])
    h = g.op("Concat", [x, mu, spk_b, cond], axis=1)  # 320 input channels, as CosyVoice2's decoder
    h = g.op("Mul", [g.conv1d(h, init.w(c, 4 * MEL_BINS, k, fan_in=k * 4 * MEL_BINS), init.zeros(c), k // 2, "down.conv"), mask])
    half = 16
    freqs = (np.exp(-np.log(10000.0) * np.arange(half) / half) * 1000.0).astype(np.float32)
    targ = g.op("Mul", [g.op("Unsqueeze", [t, g.const(i64(1))]), g.const(freqs)])
    temb = g.op("Concat", [g.op("Sin", [targ]), g.op("Cos", [targ])], axis=-1)
    temb = g.linear(g.silu(g.linear(temb, init.w(2 * half, c), init.zeros(c), "time_mlp.0")), init.w(c, c), init.zeros(c), "time_mlp.1")
    temb = g.op("Unsqueeze", [temb, g.const(i64(2))])
    key = g.chunk_key_mask(mask, streaming, 2 * p.first_hop_tokens)
    for r in range(p.est_resnets):
        h1 = g.op("Add", [g.op("Mul", [g.silu(g.conv1d(h, init.w(c, c, k, fan_in=k * c), init.zeros(c), k // 2, f"blocks.{r}.resnet.0")),
                                       mask]), temb])
        h2 = g.op("Mul", [g.conv1d(g.silu(h1), init.w(c, c, k, fan_in=k * c), init.zeros(c), k // 2, f"blocks.{r}.resnet.1"), mask])
        h = g.op("Add", [h, h2])
        xt = g.op("Transpose", [h], perm=[0, 2, 1])
        for j in range(p.est_transformers):
            xt = g.transformer_block(xt, key, c, p.est_heads, p.est_head_dim, p.est_ff, init.w, f"blocks.{r}.transformer.{j}")
        h = g.op("Mul", [g.op("Transpose", [xt], perm=[0, 2, 1]), mask])
    out = g.op("Mul", [g.conv1d(g.silu(h), init.w(MEL_BINS, c, k, fan_in=k * c), init.zeros(MEL_BINS), k // 2, "final_proj"), mask])
    g.output(out, "estimator_out", "float32", ["batch", MEL_BINS, "frames"])
    return g.model("CosyVoice2-style flow-matching estimator (random weights)")


def build_vocoder(p: Preset, init: _Init) -> onnx.ModelProto:
    """mel[B,80,T] -> waveform[B,T*480] at 24 kHz: HiFT-like x8, x5, x3 transposed convs with
    multi-kernel residual blocks, then a x4 sub-pixel stage standing in for its iSTFT (hop 4). HiFT's
    interface: a source signal from noise[B,T*480,9] (its head replaced by cache_source[B,1,C]) is
    added to the waveform and returned for the next chunk."""
    c0, c1, c2, c3 = p.voc_channels
    g = GraphBuilder("hift")
    mel = g.input("speech_feat", "float32", ["batch", MEL_BINS, "frames"])
    noise = g.input("noise", "float32", ["batch", "samples", HARMONICS])
    cache = g.input("cache_source", "float32", ["batch", 1, "cached"])
    src = g.op("Tanh", [g.linear(noise, init.w(HARMONICS, 1) * 0.1, None, "m_source.l_linear")])  # [B,L,1]
    src = g.op("Transpose", [src], perm=[0, 2, 1])
    src = g.op("Concat", [cache, g.op("Slice", [src, g.shape_of(cache, 2, 3), g.const(i64(2**62)), g.const(i64(2))])], axis=2)
    g.output(src, "source", "float32", ["batch", 1, "samples"])
    h = g.conv1d(mel, init.w(c0, MEL_BINS, 7, fan_in=7 * MEL_BINS), init.zeros(c0), 3, "conv_pre")
    for i, (cin, cout, k, s) in enumerate([(c0, c1, 16, 8), (c1, c2, 11, 5), (c2, c3, 7, 3)]):
        h = g.conv_transpose1d(g.op("LeakyRelu", [h], alpha=0.1), init.w(cin, cout, k, fan_in=cin * k // s), init.zeros(cout), s, f"ups.{i}")
        branches = []
        for j, kr in enumerate(p.voc_res_kernels):
            x = h
            for dil in p.voc_dilations:
                y = g.conv1d(g.op("LeakyRelu", [x], alpha=0.1), init.w(cout, cout, kr, fan_in=kr * cout), init.zeros(cout),
                             dil * (kr - 1) // 2, f"resblocks.{i}.{j}.convs1", dilation=dil)
                y = g.conv1d(g.op("LeakyRelu", [y], alpha=0.1), init.w(cout, cout, kr, fan_in=kr * cout), init.zeros(cout),
                             (kr - 1) // 2, f"resblocks.{i}.{j}.convs2")
                x = g.op("Add", [x, y])
            branches.append(x)
        h = branches[0] if len(branches) == 1 else g.op("Mul", [g.op("Sum", branches), g.const(np.float32(1 / len(branches)))])
    h = g.conv1d(g.op("LeakyRelu", [h], alpha=0.1), init.w(4, c3, 7, fan_in=7 * c3), init.zeros(4), 3, "conv_post")
    wav = g.op("Reshape", [g.op("Transpose", [h], perm=[0, 2, 1]), g.const(i64(0, -1))])
    wav = g.op("Mul", [g.op("Tanh", [wav]), g.const(np.float32(0.5))])
    wav = g.op("Add", [wav, g.op("Squeeze", [src, g.const(i64(1))])])
    g.output(wav, "waveform", "float32", ["batch", "samples"])
    return g.model("CosyVoice2-style vocoder, mel -> 24 kHz waveform (random weights)")


def build_speech_tokenizer(p: Preset, init: _Init) -> onnx.ModelProto:
    """feats[1,128,T] (16 kHz Whisper log-mel, 100 frames/s) + feats_length[1] -> speech tokens[1,T/4] at 25 Hz,
    the interface of upstream's speech_tokenizer_v2.onnx: 4-frame pooling and a projection onto the speech
    vocabulary, argmax."""
    g = GraphBuilder("speech_tokenizer")
    feats = g.input("feats", "float32", [1, 128, "frames"])
    g.input("feats_length", "int32", [1])
    pooled = g.op("AveragePool", [feats], kernel_shape=[4], strides=[4])
    logits = g.linear(g.op("Transpose", [pooled], perm=[0, 2, 1]), init.w(128, p.speech_vocab), None, "quantizer")
    g.output(g.op("ArgMax", [logits], axis=2, keepdims=0), "indices", "int64", [1, "tokens"])
    return g.model("CosyVoice2-style speech tokenizer (random weights)")


def build_campplus(init: _Init, hidden: int = 64) -> onnx.ModelProto:
    """fbank[1,T,80] (mean-normalized) -> speaker embedding[1,192], the interface of upstream's campplus.onnx:
    a frame-wise layer, statistics pooling over time, a projection."""
    g = GraphBuilder("campplus")
    fbank = g.input("input", "float32", [1, "frames", 80])
    h = g.op("Relu", [g.linear(fbank, init.w(80, hidden), init.zeros(hidden), "frame")])
    pooled = g.op("ReduceMean", [h, g.const(i64(1))], keepdims=0)
    g.output(g.linear(pooled, init.w(hidden, SPK_DIM) * 4.0, None, "embedding"), "output", "float32", [1, SPK_DIM])
    return g.model("CAM++-style speaker embedding (random weights)")


def _byte_level_tokenizer() -> str:
    """A byte-level BPE tokenizer with no merges (256 tokens), in the same tokenizer.json format as
    Qwen2's, so a real CosyVoice2 export's tokenizer loads through the same code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return json.dumps(json.loads(tok.to_str()), indent=1, sort_keys=True)


VOICES = [("default", 0), ("bright", 0), ("warm", 12)]  # name, prompt speech tokens (0: an SFT speaker)
# OpenAI's voice names spread over the generated voices, so OpenAI clients work unchanged.
OPENAI_ALIASES = {"alloy": "default", "ash": "warm", "ballad": "warm", "cedar": "warm", "coral": "bright",
                  "echo": "default", "fable": "bright", "marin": "bright", "nova": "bright", "onyx": "warm",
                  "sage": "default", "shimmer": "bright", "verse": "default"}


def _voices(p: Preset, init: _Init) -> dict[str, dict[str, np.ndarray]]:
    voices = {}
    for name, prompt_tokens in VOICES:
        emb = init.rng.standard_normal(SPK_DIM).astype(np.float32)
        tokens = init.rng.integers(0, p.speech_vocab, prompt_tokens).astype(np.int64)
        voices[name] = {
            "embedding": emb,
            "prompt_text_tokens": init.rng.integers(0, 256, prompt_tokens // 2).astype(np.int64),
            "prompt_speech_tokens": tokens,
            "prompt_mel": (init.rng.standard_normal((2 * prompt_tokens, MEL_BINS)) * 0.5).astype(np.float32),
        }
    return voices


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # np.savez stores zip timestamps of "now"; write members in a fixed order with a fixed date instead.
    import io
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.save(buf, arrays[key], allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())


def _fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    src = onnx.ModelProto()
    src.CopyFrom(model)  # the converter edits its input in place
    # Inputs and outputs stay float32 so the engine feeds both precisions the same way. Resize keeps float32
    # scales (its scales input must be float32); the phase accumulation of HiFT's source (CumSum) needs
    # float32 range over long utterances.
    return convert_float_to_float16(src, keep_io_types=True, disable_shape_infer=True,
                                    op_block_list=[*DEFAULT_OP_BLOCK_LIST, "Resize", "CumSum"])


def _save(model: onnx.ModelProto, path: Path, external: bool) -> None:
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save(model, str(path))


def generate(out: Path, preset: str = "tiny", seed: int = 0) -> Path:
    p = PRESETS[preset]
    out.mkdir(parents=True, exist_ok=True)
    init = _Init(seed)
    llm, emb = _random_llm(p, init)
    models = {
        "llm": llm,
        "flow_encoder": build_flow_encoder(p, init),
        "flow.decoder.estimator": build_estimator(p, init),
        "hift": build_vocoder(p, init),
    }
    files: dict[str, dict[str, str]] = {}
    for stem, model in models.items():
        files[stem] = {"fp32": f"{stem}.fp32.onnx"}
        # FP16 first: saving with external data turns the in-memory weights into file references.
        half = _fp16(model) if p.fp16 else None
        _save(model, out / files[stem]["fp32"], p.external_data)
        if half is not None:
            files[stem]["fp16"] = f"{stem}.fp16.onnx"
            _save(half, out / files[stem]["fp16"], p.external_data)
    _save_npz(out / "llm_embeddings.npz", emb)
    np.save(out / "flow_noise.npy", init.rng.standard_normal((MEL_BINS, p.noise_frames)).astype(np.float32))
    (out / "tokenizer.json").write_text(_byte_level_tokenizer() + "\n")
    (out / "voices").mkdir(exist_ok=True)
    for name, arrays in _voices(p, init).items():
        _save_npz(out / "voices" / f"{name}.npz", arrays)
    # The prompt encoders draw from their own generator: the other stages' weights do not depend on them.
    enc = _Init(seed + 1)
    prompt_encoders = {"campplus": "campplus.onnx", "speech_tokenizer": "speech_tokenizer_v2.onnx"}
    _save(build_campplus(enc), out / prompt_encoders["campplus"], False)
    _save(build_speech_tokenizer(p, enc), out / prompt_encoders["speech_tokenizer"], False)

    manifest = {
        "format": "cosyvoice2-onnx/v1",
        "name": p.name,
        "description": "Random weights with CosyVoice2's structure: audio is noise-like, for testing serving only.",
        "sample_rate": SAMPLE_RATE,
        "token_rate": 25,
        "mel_rate": 50,
        "hop_samples": HOP_SAMPLES,
        "frontend": {"tokenizer": "tokenizer.json", "max_text_tokens_per_segment": p.max_text_tokens_per_segment},
        "llm": {
            "files": files["llm"],
            "embeddings": "llm_embeddings.npz",
            "hidden_size": p.hidden,
            "num_layers": p.layers,
            "num_kv_heads": p.kv_heads,
            "head_dim": p.hidden // p.heads,
            "speech_token_size": p.speech_vocab,
            "sampling": {"top_k": 25, "top_p": 0.8, "win_size": 10, "tau_r": 0.1},
            "min_token_text_ratio": 2,
            "max_token_text_ratio": 20,
        },
        "flow": {
            "encoder": {"files": files["flow_encoder"]},
            "estimator": {"files": files["flow.decoder.estimator"]},
            "n_timesteps": p.n_timesteps,
            "cfg_rate": 0.7,
            "pre_lookahead_tokens": 3,
            "noise": "flow_noise.npy",
            "mel_bins": MEL_BINS,
            "spk_embed_dim": SPK_DIM,
        },
        "vocoder": {"files": files["hift"]},
        "streaming": {"first_hop_tokens": p.first_hop_tokens, "max_hop_tokens": p.max_hop_tokens, "hop_growth": 2,
                      "mel_cache_frames": 8},
        "voices": {"dir": "voices", "default": "default", "aliases": OPENAI_ALIASES},
        "prompt_encoders": prompt_encoders,
        "generator": {"preset": preset, "seed": seed},
    }
    (out / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return out
