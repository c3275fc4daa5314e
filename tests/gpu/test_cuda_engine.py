"""GPU checks: run only where onnxruntime-gpu can use an NVIDIA GPU (bench/gpu_check.sh runs them)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.engine.runtime import DeviceError, Runtime


def _cuda_ok() -> bool:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    try:
        Runtime("cuda")
        return True
    except DeviceError:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_ok(), reason="needs onnxruntime-gpu and an NVIDIA GPU")]


@pytest.fixture(scope="module")
def pipeline():
    from cosyvoice_server.engine.pipeline import Pipeline

    return Pipeline(BUNDLED_MODEL, "cuda", "fp32")


def test_sessions_run_on_the_cuda_provider(pipeline):
    assert pipeline.runtime.device == "cuda"
    for sess in (pipeline.llm.session, pipeline.flow.estimator, pipeline.vocoder.session):
        assert sess.get_providers()[0] == "CUDAExecutionProvider"


def test_kv_cache_stays_on_the_device_between_steps(pipeline):
    llm = pipeline.llm
    seq = llm.sequence(np.arange(12, dtype=np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.random.default_rng(0), None)
    seq.min_len = seq.max_len = 10**6
    batch = llm.prefill([seq])
    for _ in range(3):
        llm.step(batch)
        assert all(t.device_name() == "cuda" for t in batch.kv)
    merged = llm.merge(batch, llm.prefill([llm.sequence(np.arange(5, dtype=np.int64), np.zeros(0, np.int64),
                                                         np.zeros(0, np.int64), np.random.default_rng(1), None)]))
    assert all(t.device_name() == "cuda" for t in merged.kv)


def test_fp16_files_match_fp32_closely():
    rt = Runtime("cuda")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 80, 50)).astype(np.float32), "mask": np.ones((2, 1, 50), np.float32),
             "mu": rng.standard_normal((2, 80, 50)).astype(np.float32), "t": np.array([0.3, 0.7], np.float32),
             "spks": rng.standard_normal((2, 80)).astype(np.float32), "cond": np.zeros((2, 80, 50), np.float32),
             "streaming": np.array([1, 0], np.int64)}
    out = {p: rt.session(BUNDLED_MODEL / f"flow.decoder.estimator.{p}.onnx").run(None, feeds)[0] for p in ("fp32", "fp16")}
    rel = np.abs(out["fp16"] - out["fp32"]).max() / np.abs(out["fp32"]).max()
    assert rel < 2e-2
    mel = rng.standard_normal((1, 80, 40)).astype(np.float32)
    feeds = {"speech_feat": mel, "noise": rng.standard_normal((1, 40 * 480, 9)).astype(np.float32),
             "cache_source": np.zeros((1, 1, 0), np.float32)}
    wav = {p: rt.session(BUNDLED_MODEL / f"hift.{p}.onnx").run(["waveform"], feeds)[0] for p in ("fp32", "fp16")}
    assert np.abs(wav["fp16"] - wav["fp32"]).max() < 2e-2


def test_auto_precision_picks_fp16_on_cuda():
    from cosyvoice_server.engine.pipeline import Pipeline

    assert Pipeline(BUNDLED_MODEL, "cuda").precision == "fp16"
