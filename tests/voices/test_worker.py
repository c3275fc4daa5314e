"""The extraction workers: all started and warm before the pool is handed out, in the background, one
thread for BLAS and for each ONNX Runtime session, the same voice as extraction in-process; every outcome
gives the worker back or replaces it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from clips import encode, speech_like, wav
from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.frontend import TextFrontend
from cosyvoice_server.model.manifest import validate_model_dir
from cosyvoice_server.voices import clip, worker
from cosyvoice_server.voices.features import ClipError, PromptEncoder


MEMORY_MIB = 1024  # the setting's default


@pytest.fixture(scope="module")
def pool():
    p = worker.ExtractionPool(BUNDLED_MODEL, 2, MEMORY_MIB)
    yield p
    p.close()


def until_whole(pool, size: int = 2, within: float = 120) -> None:
    """Waits for replacements started in the background."""
    deadline = time.monotonic() + within
    while (pool.live < size or len(pool._free) < size) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool.live == size and len(pool._free) == size


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
    remote, facts = pool.register(encode(audio, 48000, subtype="FLOAT"), "v.wav", None, text, "v")
    assert (facts.sample_rate, facts.samples, facts.format) == (48000, len(audio), "wav")
    m = validate_model_dir(BUNDLED_MODEL, "fp32")
    local = PromptEncoder(BUNDLED_MODEL, m, TextFrontend.of_model(BUNDLED_MODEL, m.frontend)).extract(audio, 48000, text,
                                                                                                     name="v")
    for field in ("embedding", "prompt_text_tokens", "prompt_speech_tokens", "prompt_mel"):
        np.testing.assert_allclose(getattr(remote, field), getattr(local, field), rtol=1e-5, atol=1e-6)


def test_an_extraction_past_its_deadline_frees_its_worker(pool):
    """A worker that gets no CPU (stopped here; starved under SCHED_IDLE on a saturated machine) is killed
    at the deadline and replaced; the other worker is untouched and the pool serves again."""
    audio = wav(2.0, 48000)
    before = {slot.pid for slot in pool._slots}
    for pid in before:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(worker.ExtractionTimeout):
            pool.register(audio, "late.wav", None, "Too late.", "late", deadline=started + 1.0)
        assert time.monotonic() - started < 5
    finally:
        stopped = before & {slot.pid for slot in pool._slots}
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    killed = before - stopped
    assert len(killed) == 1 and len(stopped) == 1  # the one that overran, not the other
    voice, _ = pool.register(audio, "v.wav", None, "In time.", "v", deadline=time.monotonic() + 300)
    assert len(voice.prompt_speech_tokens)
    deadline = time.monotonic() + 300
    while len(pool._slots) < 2 and time.monotonic() < deadline:  # the replacement, started in the background
        time.sleep(0.2)
    now = {slot.pid for slot in pool._slots}
    assert len(now) == 2 and stopped < now and not killed & now
    for pid in killed:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_the_worker_runs_under_an_address_space_limit(pool):
    for slot in pool._slots:
        limits = Path(f"/proc/{slot.pid}/limits").read_text()
        [line] = [x for x in limits.splitlines() if x.startswith("Max address space")]
        soft = int(line.split()[3])
        size = int(Path(f"/proc/{slot.pid}/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        assert size < soft <= size + MEMORY_MIB * 2**20


def test_a_refused_clip_gives_its_worker_back(pool):
    """A failed extraction used to lose its worker: after `size` of them every registration waited for its
    deadline (503 registration_timeout) until the server restarted."""
    until_whole(pool)
    pids = {slot.pid for slot in pool._slots}
    refused = [(wav(3.0), "\u200b\u200b", "invalid_transcript"),  # no words: the transcript's fault
               (encode(np.full(48000 * 3, 1e19, np.float32), 48000, subtype="FLOAT"), None, "audio_out_of_range"),
               (b"not audio" * 100, None, "invalid_audio")]
    for _ in range(2):  # more failures than workers
        for data, transcript, code in refused:
            with pytest.raises((clip.ClipRejected, ClipError)) as info:
                pool.register(data, "a.wav", None, transcript, "bad", deadline=time.monotonic() + 60)
            assert info.value.code == code
    assert {slot.pid for slot in pool._slots} == pids and len(pool._free) == 2
    voice, _ = pool.register(wav(3.0), "a.wav", None, "Hello there.", "good", deadline=time.monotonic() + 60)
    assert len(voice.prompt_speech_tokens)


def test_a_worker_that_died_is_replaced_and_registration_goes_on(pool):
    until_whole(pool)
    victim = pool._free[0].pid
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(worker.WorkerDied):
        pool.register(wav(2.0), "a.wav", None, None, "x", deadline=time.monotonic() + 60)
    voice, _ = pool.register(wav(2.0), "a.wav", None, None, "x", deadline=time.monotonic() + 60)
    assert len(voice.prompt_speech_tokens)
    until_whole(pool)
    assert victim not in {slot.pid for slot in pool._slots}


def hog(mib: int) -> int:
    """Runs in a worker: holds `mib` MiB there until the process ends (a leak)."""
    global _held
    _held = np.ones(mib * 2**18, np.float32)
    return os.getpid()


@pytest.fixture(scope="module")
def small_pool():
    replaced = []
    p = worker.ExtractionPool(BUNDLED_MODEL, 1, 96, on_replace=replaced.append)
    p.replaced = replaced
    yield p
    p.close()


def test_a_clip_that_needs_more_memory_than_allowed_is_a_400_and_the_worker_is_replaced(small_pool):
    until_whole(small_pool, 1)
    before = {slot.pid for slot in small_pool._slots}
    with pytest.raises(clip.ClipRejected) as info:
        small_pool.register(wav(30.0, 192000), "big.wav", None, None, "big", deadline=time.monotonic() + 120)
    assert info.value.code == "audio_too_complex" and "memory" in info.value.message
    assert small_pool.replaced[-1] == "memory"
    until_whole(small_pool, 1)
    assert not before & {slot.pid for slot in small_pool._slots}


def test_a_worker_that_keeps_memory_after_an_extraction_is_replaced(small_pool):
    until_whole(small_pool, 1)
    [slot] = small_pool._slots
    assert slot.pool.submit(hog, 60).result() == slot.pid  # over half of its 96 MiB allowance
    voice, _ = small_pool.register(wav(2.0), "a.wav", None, None, "v", deadline=time.monotonic() + 60)
    assert len(voice.prompt_speech_tokens)  # answered, then the worker is replaced
    assert small_pool.replaced[-1] == "leak"
    until_whole(small_pool, 1)
    assert slot not in small_pool._slots


def test_a_pool_that_cannot_replace_its_worker_says_so_and_close_answers_waiters(tmp_path):
    p = worker.ExtractionPool(BUNDLED_MODEL, 1, MEMORY_MIB)
    try:
        assert p.unavailable is None
        p.model_dir = str(tmp_path)  # the model is gone: replacements fail
        [slot] = p._slots
        os.kill(slot.pid, signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(worker.WorkerDied):
            p.register(wav(2.0), "a.wav", None, None, "x")
        deadline = time.monotonic() + 60
        while p.unavailable is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "model" in p.unavailable
        # a registration waiting for a worker is answered when the server stops, not at its deadline
        closer = threading.Timer(0.5, p.close)
        closer.start()
        started = time.monotonic()
        with pytest.raises(worker.PoolClosed):
            p.register(wav(2.0), "a.wav", None, None, "x", deadline=time.monotonic() + 60)
        assert time.monotonic() - started < 5
    finally:
        p.close()
