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

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from ..engine.pipeline import Voice
from ..frontend import TextFrontend
from ..model.manifest import validate_model_dir
from ..procpool import start_pool
from .features import PromptEncoder

# Where SCHED_IDLE is refused (not Linux, or a seccomp profile that forbids it): the lowest priority.
FALLBACK_NICE = 19
# The encoders' ONNX Runtime sessions and numpy's BLAS: one thread each, one core at most.
THREADS = 1

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


class ExtractionPool:
    """`size` worker processes; `extract` blocks (call it from a thread)."""

    def __init__(self, model_dir: Path, size: int) -> None:
        self.model_dir = str(model_dir)
        self.size = size
        self.busy = 0  # extractions running or waiting for a worker (counted on the event loop)
        self.pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        """Starts every worker and waits for their encoders, so a model that cannot clone fails at start-up."""
        return start_pool(self.size, _init, (self.model_dir,), _ready,
                          "voice registration cannot start its feature extraction")

    def extract(self, audio: np.ndarray, sample_rate: int, transcript: str | None, name: str) -> Voice:
        from concurrent.futures.process import BrokenProcessPool

        try:
            return self.pool.submit(_extract, audio, sample_rate, transcript, name).result()
        except BrokenProcessPool:  # a worker died (killed for memory, say): start fresh ones for the next call
            self.pool = self._start()
            raise

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
