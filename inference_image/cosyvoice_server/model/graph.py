"""A small ONNX graph builder over `onnx.helper`.

Used by the model generator (random-weight CosyVoice2-structured models) and by the engine's
on-device tensor operations (KV-cache re-layout, Euler updates). Names are deterministic so a
generated model is byte-for-byte reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18

DTYPES = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "bool": TensorProto.BOOL,
}


class GraphBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._n = 0

    def _fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def input(self, name: str, dtype: str, shape: Sequence[int | str | None]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, DTYPES[dtype], list(shape)))
        return name

    def output(self, value: str, name: str, dtype: str, shape: Sequence[int | str | None]) -> str:
        if value != name:
            self.nodes.append(helper.make_node("Identity", [value], [name]))
        self.outputs.append(helper.make_tensor_value_info(name, DTYPES[dtype], list(shape)))
        return name

    def const(self, array: np.ndarray, hint: str = "c") -> str:
        name = self._fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, n_out: int = 1, **attrs) -> str | list[str]:
        outs = [self._fresh(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else outs

    # Layers used by the generated models -------------------------------------------------
    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None = None, hint: str = "linear") -> str:
        """x[..., in] @ weight[in, out] (+ bias)."""
        y = self.op("MatMul", [x, self.const(weight.astype(np.float32), f"{hint}.weight")], hint)
        if bias is not None:
            y = self.op("Add", [y, self.const(bias.astype(np.float32), f"{hint}.bias")], hint)
        return y

    def conv1d(self, x: str, weight: np.ndarray, bias: np.ndarray, pad: int, hint: str = "conv", dilation: int = 1) -> str:
        return self.op(
            "Conv",
            [x, self.const(weight.astype(np.float32), f"{hint}.weight"), self.const(bias.astype(np.float32), f"{hint}.bias")],
            hint,
            pads=[pad, pad],
            dilations=[dilation],
        )

    def conv_transpose1d(self, x: str, weight: np.ndarray, bias: np.ndarray, stride: int, hint: str = "up") -> str:
        """Output length is exactly stride x input length for kernel sizes stride + 2k (HiFT's 16/8, 11/5, 7/3)."""
        trim = weight.shape[2] - stride
        return self.op(
            "ConvTranspose",
            [x, self.const(weight.astype(np.float32), f"{hint}.weight"), self.const(bias.astype(np.float32), f"{hint}.bias")],
            hint,
            strides=[stride],
            pads=[trim // 2, trim - trim // 2],
        )

    def layer_norm(self, x: str, dim: int, hint: str = "ln") -> str:
        return self.op("LayerNormalization", [x, self.const(np.ones(dim, np.float32), f"{hint}.weight"),
                                              self.const(np.zeros(dim, np.float32), f"{hint}.bias")], hint, axis=-1)

    def gelu(self, x: str) -> str:
        # erf form: opset 18 has no Gelu operator
        inner = self.op("Add", [self.const(np.float32(1.0)), self.op("Erf", [self.op("Mul", [x, self.const(np.float32(2 ** -0.5))])])])
        return self.op("Mul", [self.op("Mul", [x, inner]), self.const(np.float32(0.5))])

    def self_attention(self, x: str, mask_add: str, dim: int, heads: int, head_dim: int, w, hint: str) -> str:
        """Multi-head self-attention over x[B,T,dim] with an additive key mask[B,1,1,T]."""
        inner = heads * head_dim

        def split(t: str) -> str:
            return self.op("Transpose", [self.op("Reshape", [t, self.const(i64(0, 0, heads, head_dim))])], perm=[0, 2, 1, 3])

        q = split(self.linear(x, w(dim, inner), None, f"{hint}.to_q"))
        k = split(self.linear(x, w(dim, inner), None, f"{hint}.to_k"))
        v = split(self.linear(x, w(dim, inner), None, f"{hint}.to_v"))
        scores = self.op("Mul", [self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                                 self.const(np.float32(head_dim ** -0.5))])
        att = self.op("MatMul", [self.op("Softmax", [self.op("Add", [scores, mask_add])], axis=-1), v])
        att = self.op("Reshape", [self.op("Transpose", [att], perm=[0, 2, 1, 3]), self.const(i64(0, 0, -1))])
        return self.linear(att, w(inner, dim), np.zeros(dim, np.float32), f"{hint}.to_out")

    def transformer_block(self, x: str, mask_add: str, dim: int, heads: int, head_dim: int, ff: int, w, hint: str) -> str:
        """Pre-norm block: x + attn(LN(x)), then x + FF(LN(x)) with GELU."""
        x = self.op("Add", [x, self.self_attention(self.layer_norm(x, dim, f"{hint}.norm1"), mask_add, dim, heads, head_dim, w,
                                                   f"{hint}.attn")])
        h = self.gelu(self.linear(self.layer_norm(x, dim, f"{hint}.norm3"), w(dim, ff), np.zeros(ff, np.float32), f"{hint}.ff.0"))
        return self.op("Add", [x, self.linear(h, w(ff, dim), np.zeros(dim, np.float32), f"{hint}.ff.2")])

    def key_mask(self, mask: str) -> str:
        """mask[B,1,T] of 1/0 -> additive [B,1,1,T] (0 or -1e4, safe in fp16)."""
        m = self.op("Unsqueeze", [mask, self.const(i64(1))])
        return self.op("Mul", [self.op("Sub", [self.const(np.float32(1.0)), m]), self.const(np.float32(-1e4))])

    def chunk_key_mask(self, mask: str, streaming: str, chunk: int) -> str:
        """mask[B,1,T] of 1/0 and streaming[B] -> additive [B,1,T,T]: rows that stream see keys only up to
        the end of their query's chunk of `chunk` frames (upstream's static chunk mask), others all keys."""
        t = self.op("Squeeze", [self.shape_of(mask, 2, 3)])
        pos = self.op("Range", [self.const(np.int64(0)), t, self.const(np.int64(1))])
        block_end = self.op("Mul", [self.op("Add", [self.op("Div", [pos, self.const(np.int64(chunk))]), self.const(np.int64(1))]),
                                    self.const(np.int64(chunk))])
        beyond = self.op("GreaterOrEqual", [self.op("Unsqueeze", [pos, self.const(i64(0))]),
                                            self.op("Unsqueeze", [block_end, self.const(i64(1))])])  # [T,T]
        rows = self.op("Reshape", [self.op("Cast", [streaming], to=TensorProto.BOOL), self.const(i64(-1, 1, 1, 1))])
        hidden = self.op("Or", [self.op("And", [rows, beyond]),
                                self.op("Unsqueeze", [self.op("Equal", [mask, self.const(np.float32(0.0))]), self.const(i64(1))])])
        return self.op("Where", [hidden, self.const(np.float32(-1e4)), self.const(np.float32(0.0))])

    def rms_norm(self, x: str, weight: np.ndarray, hint: str = "norm", eps: float = 1e-6) -> str:
        """Qwen2's RMSNorm, written out because opset 18 has no RMSNormalization."""
        ms = self.op("ReduceMean", [self.op("Mul", [x, x]), self.const(i64(-1))], hint, keepdims=1)
        inv = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [ms, self.const(np.float32(eps))])])])
        return self.op("Mul", [self.op("Mul", [x, inv]), self.const(weight.astype(np.float32), f"{hint}.weight")], hint)

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])], "silu")

    def shape_of(self, x: str, start: int, end: int | None = None) -> str:
        attrs = {"start": start} if end is None else {"start": start, "end": end}
        return self.op("Shape", [x], "shape", **attrs)

    def model(self, doc: str = "", producer: str = "cosyvoice-server") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=producer)
        model.ir_version = 9
        model.doc_string = doc
        onnx.checker.check_model(model)
        return model


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)
