"""Tensor operations run as tiny ONNX graphs on the engine's device.

Continuous batching re-lays the KV cache whenever requests join or leave, and flow matching updates
its state between estimator calls. Doing that in numpy would copy every tensor to the host and back;
these graphs run where the tensors already are (the GPU under the CUDA provider).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from ..model.graph import GraphBuilder, i64
from .runtime import Runtime


def _kv_select(n: int) -> bytes:
    """kv.j[B,H,P,D] -> rows chosen, positions from `start` on (drops left padding nobody needs)."""
    g = GraphBuilder("kv_select")
    rows = g.input("rows", "int64", ["rows"])
    start = g.input("start", "int64", [1])
    end = g.const(i64(2**62))
    axis = g.const(i64(2))
    for j in range(n):
        kv = g.input(f"kv.{j}", "float32", ["b", "h", "p", "d"])
        out = g.op("Slice", [g.op("Gather", [kv, rows], axis=0), start, end, axis])
        g.output(out, f"out.{j}", "float32", ["rows", "h", "q", "d"])
    return g.model().SerializeToString()


def _kv_merge(n: int) -> bytes:
    """Left-pads two batches to one length and stacks them: a.j[Ba,H,Pa,D] + b.j[Bb,H,Pb,D]."""
    g = GraphBuilder("kv_merge")
    pads_a = g.input("pads_a", "int64", [8])
    pads_b = g.input("pads_b", "int64", [8])
    for j in range(n):
        a = g.input(f"a.{j}", "float32", ["ba", "h", "pa", "d"])
        b = g.input(f"b.{j}", "float32", ["bb", "h", "pb", "d"])
        out = g.op("Concat", [g.op("Pad", [a, pads_a]), g.op("Pad", [b, pads_b])], axis=0)
        g.output(out, f"out.{j}", "float32", ["b", "h", "p", "d"])
    return g.model().SerializeToString()


def _cfm_step() -> bytes:
    """One Euler step with classifier-free guidance: the estimator ran on [x; x] with and without
    conditions, so v = (1 + cfg) * v_cond - cfg * v_uncond, x += dt * v. Also returns [x; x] for the
    next estimator call."""
    g = GraphBuilder("cfm_step")
    x = g.input("x", "float32", ["b", 80, "t"])
    out = g.input("estimator_out", "float32", ["b2", 80, "t"])
    dt = g.input("dt", "float32", [1])
    cfg = g.input("cfg", "float32", [1])
    b = g.shape_of(x, 0, 1)
    v_cond = g.op("Slice", [out, g.const(i64(0)), b, g.const(i64(0))])
    v_unc = g.op("Slice", [out, b, g.const(i64(2**62)), g.const(i64(0))])
    one_plus = g.op("Add", [cfg, g.const(np.float32(1.0))])
    v = g.op("Sub", [g.op("Mul", [v_cond, one_plus]), g.op("Mul", [v_unc, cfg])])
    x_new = g.op("Add", [x, g.op("Mul", [v, dt])])
    g.output(x_new, "x_new", "float32", ["b", 80, "t"])
    g.output(g.op("Concat", [x_new, x_new], axis=0), "x2", "float32", ["b2", 80, "t"])
    return g.model().SerializeToString()


class KVOps:
    """Row selection and batch merging for the LLM's per-layer KV tensors."""

    def __init__(self, rt: Runtime, kv_tensors: int) -> None:
        self.rt = rt
        self.n = kv_tensors
        self._select = rt.session(_kv_select(kv_tensors))
        self._merge = rt.session(_kv_merge(kv_tensors))

    def kv_select(self, kv: list[ort.OrtValue], rows: np.ndarray, start: int) -> list[ort.OrtValue]:
        b = self._select.io_binding()
        b.bind_cpu_input("rows", rows.astype(np.int64))
        b.bind_cpu_input("start", i64(start))
        for j, t in enumerate(kv):
            b.bind_ortvalue_input(f"kv.{j}", t)
            self.rt.bind_out(b, f"out.{j}")
        self._select.run_with_iobinding(b)
        return b.get_outputs()

    def kv_merge(self, a: list[ort.OrtValue], pad_a: int, b_: list[ort.OrtValue], pad_b: int) -> list[ort.OrtValue]:
        b = self._merge.io_binding()
        b.bind_cpu_input("pads_a", i64(0, 0, pad_a, 0, 0, 0, 0, 0))
        b.bind_cpu_input("pads_b", i64(0, 0, pad_b, 0, 0, 0, 0, 0))
        for j in range(self.n):
            b.bind_ortvalue_input(f"a.{j}", a[j])
            b.bind_ortvalue_input(f"b.{j}", b_[j])
            self.rt.bind_out(b, f"out.{j}")
        self._merge.run_with_iobinding(b)
        return b.get_outputs()



class CFMStep:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._cfm = rt.session(_cfm_step())

    def __call__(self, x: ort.OrtValue, estimator_out: ort.OrtValue, dt: float, cfg: float) -> tuple[ort.OrtValue, ort.OrtValue]:
        b = self._cfm.io_binding()
        b.bind_ortvalue_input("x", x)
        b.bind_ortvalue_input("estimator_out", estimator_out)
        b.bind_cpu_input("dt", np.array([dt], np.float32))
        b.bind_cpu_input("cfg", np.array([cfg], np.float32))
        self.rt.bind_out(b, "x_new")
        self.rt.bind_out(b, "x2")
        self._cfm.run_with_iobinding(b)
        x_new, x2 = b.get_outputs()
        return x_new, x2
