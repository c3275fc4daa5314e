"""The LLM stage's ONNX graph, built by the project for every family: a Qwen2 decoder step with a KV cache and the
speech head (`llm_decoder`), filled from a converted checkpoint's weights (convert/convert.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from .graph import GraphBuilder, i64

SPECIAL_TOKENS = 3  # CosyVoice2's speech head: tokens, then eos (= speech_vocab) and two fill tokens


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
    return g.model("CosyVoice LLM decoder step with KV cache")
