"""The extraction workers: all started and warm before the pool is handed out, in the background, one
thread for BLAS and for each ONNX Runtime session, the same voice as extraction in-process."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from clips import speech_like
from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.frontend import TextFrontend
from cosyvoice_server.model.manifest import validate_model_dir
from cosyvoice_server.voices import worker
from cosyvoice_server.voices.features import PromptEncoder


@pytest.fixture(scope="module")
def pool():
    p = worker.ExtractionPool(BUNDLED_MODEL, 2)
    yield p
    p.close()


def test_every_worker_is_started_and_warm_before_the_pool_is_used(pool):
    # a spawn pool would otherwise start the second worker during the second concurrent registration
    processes = list(pool.pool._processes.values())
    assert len(processes) == 2 and all(p.is_alive() for p in processes)
    for p in processes:  # each has run its initializer, which puts every thread in the background first
        policies = {os.sched_getscheduler(int(t.name)) for t in Path(f"/proc/{p.pid}/task").iterdir()}
        assert policies == {os.SCHED_IDLE} or os.getpriority(os.PRIO_PROCESS, p.pid) == worker.FALLBACK_NICE


def test_workers_run_in_the_background_on_one_thread_per_library(pool):
    s = pool.pool.submit(worker.settings).result()
    assert s["policies"] == {os.SCHED_IDLE} or s["nice"] == {worker.FALLBACK_NICE}
    assert s["blas_threads"] == {1}  # numpy's OpenBLAS would use a thread per core and spin after each call
    assert s["intra_op_threads"] == {1}


def test_a_worker_extracts_what_the_server_process_would(pool):
    audio, text = speech_like(4.0, 48000), "Hello, this is a test."
    remote = pool.extract(audio, 48000, text, "v")
    m = validate_model_dir(BUNDLED_MODEL, "fp32")
    f = m.frontend
    frontend = TextFrontend(BUNDLED_MODEL / f.tokenizer, f.max_text_tokens_per_segment, f.min_text_tokens_per_segment,
                            f.merge_text_tokens, f.text_frontend)
    local = PromptEncoder(BUNDLED_MODEL, m, frontend).extract(audio, 48000, text, name="v")
    for field in ("embedding", "prompt_text_tokens", "prompt_speech_tokens", "prompt_mel"):
        np.testing.assert_allclose(getattr(remote, field), getattr(local, field), rtol=1e-5, atol=1e-6)
