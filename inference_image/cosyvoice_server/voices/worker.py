"""Voice feature extraction in child processes that take only the CPU synthesis leaves over.

The synthesis stages are threads of the server process: they share its GIL. Extraction in another thread
of that process would hold the GIL in its Python and C-extension sections while the stage threads wait.
A child process has its own interpreter; the server's part of a registration (reading the upload,
decoding and hashing the clip, writing the store) is a few milliseconds of mostly GIL-free work.

What a registration then costs the streams is the child's CPU on the cores the stage threads run on, so
the child keeps to what they leave:

- every thread runs under SCHED_IDLE (Linux): the kernel gives it a core only when no other thread wants
  one, and a waking stage thread takes the core back at once. A nice value only weighs the child less (at
  nice 10, 110 against 1024) and still lets it finish its time slice while a stage thread waits. Where
  SCHED_IDLE is refused the child runs at nice 19.
- numpy's BLAS runs on one thread (threadpoolctl). OpenBLAS starts a thread per core; the mel filterbank
  products were split across both cores and its threads then spun for about 0.1 s after each call,
  about twice the CPU of the extraction itself, on the core the extraction was not using.
- ONNX Runtime sessions get one intra-op thread, whatever the server's `--intra-op-threads` (the two
  encoders are small; more threads would only take more cores from the stages).
- Every worker starts, builds its encoder and runs one extraction before the server reports ready, and
  lives as long as the server: no process start-up, imports or session creation during a registration.
  (A `spawn` pool starts its workers on demand, the second one during the second concurrent registration,
  at the server's priority while it imports; so all are started at once, up front.)

The pool is started whole before the server is ready (procpool.py).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from ..engine.pipeline import Voice
from ..frontend import TextFrontend
from ..model.manifest import validate_model_dir
from ..procpool import start_pool
from .features import PromptEncoder

log = logging.getLogger(__name__)

# Where SCHED_IDLE is refused (not Linux, or a seccomp profile that forbids it): the lowest priority.
FALLBACK_NICE = 19
# The encoders' ONNX Runtime sessions and numpy's BLAS: one thread each, one core at most.
THREADS = 1
RESTART_RETRY_S = 5.0  # between attempts to start a replacement worker that failed to start

_encoder: PromptEncoder | None = None
_error: str | None = None


def _background() -> None:
    """Every thread of this process, not only the calling one (Linux sets the policy per thread): numpy's
    BLAS started its threads when the module was imported, before this runs. Threads started later inherit it."""
    tasks = Path("/proc/self/task")
    for tid in (int(t.name) for t in tasks.iterdir()) if tasks.is_dir() else [0]:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, PermissionError):  # no SCHED_IDLE here: the weakest nice value instead
            try:
                os.setpriority(os.PRIO_PROCESS, tid, FALLBACK_NICE)
            except OSError:
                pass
        except OSError:  # a thread that ended meanwhile
            pass


def _init(model_dir: str) -> None:
    global _encoder, _error
    try:
        _background()
        threadpool_limits(THREADS)
        m = validate_model_dir(Path(model_dir), "fp32")
        _encoder = PromptEncoder(Path(model_dir), m, TextFrontend.of_model(Path(model_dir), m.frontend), threads=THREADS)
        # One extraction now: the text normalizers and the sessions load before the server is ready, not
        # during the first registration (at this priority, on a busy CPU, that would take a minute).
        t = np.arange(24000) / 16000
        _encoder.extract((0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 16000, "Warm-up.")
    except Exception as exc:  # reported by `ready`, so start-up fails with the reason
        _error = f"{exc.__class__.__name__}: {exc}"


def _ready() -> tuple[int, str | None]:
    return os.getpid(), _error


def settings() -> dict:
    """What this worker runs with (for tests and diagnostics): scheduling policy and nice value per thread,
    BLAS threads, the sessions' intra-op threads."""
    tasks = [int(t.name) for t in Path("/proc/self/task").iterdir()]
    return {"policies": {os.sched_getscheduler(t) for t in tasks},
            "nice": {os.getpriority(os.PRIO_PROCESS, t) for t in tasks},
            "blas_threads": {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"},
            "intra_op_threads": {s.get_session_options().intra_op_num_threads
                                 for s in (_encoder.campplus, _encoder.tokenizer)} if _encoder else set()}


def _extract(audio: np.ndarray, sample_rate: int, transcript: str | None, name: str) -> Voice:
    assert _encoder is not None, _error
    return _encoder.extract(audio, sample_rate, transcript, name=name)


class ExtractionTimeout(Exception):
    """No worker was free, or the extraction did not finish, by the registration's deadline."""


@dataclass(frozen=True, eq=False)
class _Slot:
    pool: ProcessPoolExecutor  # of one worker
    pid: int


class ExtractionPool:
    """`size` worker processes, each in a pool of its own, so that one whose extraction overruns its
    deadline (starved under SCHED_IDLE on a saturated CPU, or stuck) is killed and replaced without
    touching the others. `extract` blocks (call it from a thread)."""

    def __init__(self, model_dir: Path, size: int) -> None:
        self.model_dir = str(model_dir)
        self.size = size
        self.busy = 0  # extractions running or waiting for a worker (counted on the event loop)
        self._free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._slots: set[_Slot] = set()  # every live worker, free or busy
        self._lock = threading.Lock()
        self._closed = False
        # All at once, and every one warm before the server is ready: a model that cannot clone fails here.
        with ThreadPoolExecutor(size) as starting:
            started = [starting.submit(self._start) for _ in range(size)]
        if problem := next((f.exception() for f in started if f.exception() is not None), None):
            for f in started:
                if f.exception() is None:
                    f.result().pool.shutdown(wait=False, cancel_futures=True)
            raise problem
        for f in started:
            self._add(f.result())

    def _start(self) -> _Slot:
        pool, [pid] = start_pool(1, _init, (self.model_dir,), _ready,
                                 "voice registration cannot start its feature extraction")
        return _Slot(pool, pid)

    def _add(self, slot: _Slot) -> None:
        with self._lock:
            if self._closed:
                slot.pool.shutdown(wait=False, cancel_futures=True)
                return
            self._slots.add(slot)
        self._free.put(slot)

    def extract(self, audio: np.ndarray, sample_rate: int, transcript: str | None, name: str,
                deadline: float = math.inf) -> Voice:
        """The voice, once a worker is free and has extracted it, by `deadline` (time.monotonic()) or
        ExtractionTimeout. A worker that overran it, or died (BrokenProcessPool), is replaced in the background."""
        try:
            slot = self._free.get(timeout=None if deadline == math.inf else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise ExtractionTimeout from None
        if time.monotonic() >= deadline:
            self._free.put(slot)
            raise ExtractionTimeout
        try:
            future = slot.pool.submit(_extract, audio, sample_rate, transcript, name)
            voice = future.result(None if deadline == math.inf else max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            try:
                os.kill(slot.pid, signal.SIGKILL)  # its work is for nobody now; it would hold the slot
            except ProcessLookupError:
                pass
            self._replace(slot)
            raise ExtractionTimeout from None
        except BrokenProcessPool:  # it died (killed for memory, say)
            self._replace(slot)
            raise
        self._free.put(slot)
        return voice

    def _replace(self, slot: _Slot) -> None:
        """A fresh worker for `slot`'s, started in the background: the registration that found it broken is
        answered now, and the next one waits (up to its deadline) for the replacement."""
        slot.pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._slots.discard(slot)
        threading.Thread(target=self._restart, name="voice-worker-restart", daemon=True).start()

    def _restart(self) -> None:
        while not self._closed:
            try:
                self._add(self._start())
                return
            except Exception as exc:  # noqa: BLE001 (a full /tmp, a memory limit: try again, said in the log)
                log.error("the voice extraction worker could not be restarted (%s); retrying in %g s", exc,
                          RESTART_RETRY_S)
                time.sleep(RESTART_RETRY_S)

    def close(self) -> None:
        """Stops every worker now: an extraction still running is for nobody once the server stops."""
        with self._lock:
            self._closed = True
            slots, self._slots = self._slots, set()
        for slot in slots:
            try:
                os.kill(slot.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            slot.pool.shutdown(wait=False, cancel_futures=True)
