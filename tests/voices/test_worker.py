"""The extraction workers: all started and warm before the pool is handed out, in the background, one
thread for BLAS and for each ONNX Runtime session, the same voice as extraction in-process."""

from __future__ import annotations

import os
import signal
import time
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
    pids = [slot.pid for slot in pool._slots]
    assert len(pids) == 2 and all(Path(f"/proc/{pid}").exists() for pid in pids)
    for pid in pids:  # each has run its initializer, which puts every thread in the background first
        policies = {os.sched_getscheduler(int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir()}
        assert policies == {os.SCHED_IDLE} or os.getpriority(os.PRIO_PROCESS, pid) == worker.FALLBACK_NICE


def test_workers_run_in_the_background_on_one_thread_per_library(pool):
    s = next(iter(pool._slots)).pool.submit(worker.settings).result()
    assert s["policies"] == {os.SCHED_IDLE} or s["nice"] == {worker.FALLBACK_NICE}
    assert s["blas_threads"] == {1}  # numpy's OpenBLAS would use a thread per core and spin after each call
    assert s["intra_op_threads"] == {1}


def test_a_worker_extracts_what_the_server_process_would(pool):
    audio, text = speech_like(4.0, 48000), "Hello, this is a test."
    remote = pool.extract(audio, 48000, text, "v")
    m = validate_model_dir(BUNDLED_MODEL, "fp32")
    local = PromptEncoder(BUNDLED_MODEL, m, TextFrontend.of_model(BUNDLED_MODEL, m.frontend)).extract(audio, 48000, text,
                                                                                                     name="v")
    for field in ("embedding", "prompt_text_tokens", "prompt_speech_tokens", "prompt_mel"):
        np.testing.assert_allclose(getattr(remote, field), getattr(local, field), rtol=1e-5, atol=1e-6)


def test_an_extraction_past_its_deadline_frees_its_worker(pool):
    """A worker that gets no CPU (stopped here; starved under SCHED_IDLE on a saturated machine) is killed
    at the deadline and replaced; the other worker is untouched and the pool serves again."""
    audio = speech_like(2.0, 48000)
    before = {slot.pid for slot in pool._slots}
    for pid in before:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(worker.ExtractionTimeout):
            pool.extract(audio, 48000, "Too late.", "late", deadline=started + 1.0)
        assert time.monotonic() - started < 5
    finally:
        stopped = before & {slot.pid for slot in pool._slots}
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    killed = before - stopped
    assert len(killed) == 1 and len(stopped) == 1  # the one that overran, not the other
    voice = pool.extract(audio, 48000, "In time.", "v", deadline=time.monotonic() + 300)
    assert len(voice.prompt_speech_tokens)
    deadline = time.monotonic() + 300
    while len(pool._slots) < 2 and time.monotonic() < deadline:  # the replacement, started in the background
        time.sleep(0.2)
    now = {slot.pid for slot in pool._slots}
    assert len(now) == 2 and stopped < now and not killed & now
    for pid in killed:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
