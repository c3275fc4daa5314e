"""ONNX Runtime sessions on one device, and tensors that stay there.

On CUDA the execution provider gets the options that matter for MIG slices (device_id,
gpu_mem_limit, arena_extend_strategy, cudnn_conv_algo_search, do_copy_in_default_stream), and the
engine moves data through IO binding so KV caches and flow states stay on the GPU between runs.
On CPU the same code runs with device type "cpu".
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort

from ..cpus import usable_cores
from ..startup import Phases

log = logging.getLogger(__name__)

DeviceRequest = Literal["auto", "cpu", "cuda"]


class DeviceError(RuntimeError):
    """The requested device cannot be used; the message says what is missing."""


@dataclass(frozen=True)
class RuntimeOptions:
    device_id: int = 0
    gpu_mem_limit_bytes: int | None = None
    arena_extend_strategy: str = "kSameAsRequested"  # a MIG slice has no room for power-of-two growth
    cudnn_conv_algo_search: str = "HEURISTIC"  # EXHAUSTIVE re-benchmarks every new chunk length
    intra_op_threads: int = 1
    flow_threads: int = 0  # the flow's sessions (the stage that dominates at real size); 0: see Runtime.flow_threads


def cuda_missing_reason() -> str | None:
    """None when ONNX Runtime can offer CUDA, else what is missing, in words."""
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return (
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (available: {', '.join(providers)}); "
            "install onnxruntime-gpu instead of onnxruntime (pip install 'cosyvoice-server[gpu]'), "
            "with CUDA 12/13 and cuDNN 9 libraries and an NVIDIA driver visible to the process"
        )
    return None


def _probe_model() -> bytes:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]).SerializeToString()


class Runtime:
    def __init__(self, device: DeviceRequest, options: RuntimeOptions | None = None, phases: Phases | None = None) -> None:
        self.options = options or RuntimeOptions()
        self.phases = phases
        self.device = self._resolve(device)
        self.ort_device = "cuda" if self.device == "cuda" else "cpu"
        self.device_id = self.options.device_id if self.device == "cuda" else 0
        self.flow_threads = self._flow_threads()

    def _flow_threads(self) -> int:
        """On the CPU the flow is the stage that runs longest (98 % of a real-size replica's samples at 8
        streams): by default its sessions get every core the container may use (measured on 2 cores: 1.87 x
        upstream's throughput against 1.35 x with one thread). Their idle threads do not spin, so the LLM and
        vocoder still get the cores while the flow waits. On CUDA the threads only feed the device."""
        if self.options.flow_threads:
            return self.options.flow_threads
        if self.device == "cpu":
            return usable_cores()
        return self.options.intra_op_threads

    def _providers(self, device: str) -> list:
        if device != "cuda":
            return ["CPUExecutionProvider"]
        o = self.options
        cuda = {
            "device_id": o.device_id,
            "arena_extend_strategy": o.arena_extend_strategy,
            "cudnn_conv_algo_search": o.cudnn_conv_algo_search,
            "do_copy_in_default_stream": True,
        }
        if o.gpu_mem_limit_bytes:
            cuda["gpu_mem_limit"] = o.gpu_mem_limit_bytes
        return [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]

    def _cuda_works(self) -> str | None:
        reason = cuda_missing_reason()
        if reason:
            return reason
        try:
            sess = ort.InferenceSession(_probe_model(), providers=self._providers("cuda"))
        except Exception as exc:  # the CUDA EP raises on missing libraries or devices
            return f"the CUDA execution provider failed to start: {exc}"
        if sess.get_providers()[0] != "CUDAExecutionProvider":
            return "ONNX Runtime fell back to the CPU when asked for CUDA (missing CUDA/cuDNN libraries or no GPU visible)"
        return None

    def _resolve(self, device: DeviceRequest) -> str:
        if device == "cpu":
            return "cpu"
        reason = self._cuda_works()
        if reason is None:
            return "cuda"
        if device == "cuda":
            raise DeviceError(f"--device cuda was requested but cannot be used: {reason}. Use --device cpu or auto to run on the CPU.")
        log.info("device auto: using the CPU (%s)", reason)
        return "cpu"

    def session(self, path: Path | bytes, stage: str | None = None) -> ort.InferenceSession:
        """A session on the device; a named `stage`'s creation is timed as the start-up phase session_<stage>."""
        with self.phases(f"session_{stage}") if stage and self.phases else nullcontext():
            return self._session(path, stage or "")

    def _session(self, path: Path | bytes, stage: str = "") -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        threads = self.options.intra_op_threads
        if stage.startswith("flow"):
            threads = self.flow_threads
            log.info("%s sessions: %d threads", stage, threads)
        so.intra_op_num_threads = threads
        if threads != 1:
            # Idle pool threads would spin on the cores the other stages' threads need.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        model = str(path) if isinstance(path, Path) else path
        sess = ort.InferenceSession(model, sess_options=so, providers=self._providers(self.device))
        if self.device == "cuda" and sess.get_providers()[0] != "CUDAExecutionProvider":
            raise DeviceError(f"{path}: the session did not get the CUDA execution provider")
        return sess

    def to_device(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.ort_device, self.device_id)

    def bind_out(self, binding: ort.IOBinding, name: str) -> None:
        """Output allocated on the device: it never visits the host unless asked for."""
        binding.bind_output(name, self.ort_device, self.device_id)
