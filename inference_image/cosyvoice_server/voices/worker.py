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

The worker is also the sandbox for the upload: the clip is sniffed, parsed (libsndfile), decoded and
resampled there, never in the server process, and once it is warm the worker's address space is limited
(RLIMIT_AS) to what it holds then plus `memory_mib`: a clip that would need more fails its allocation in
the worker (a 400 `audio_too_complex`), not the server.

Every outcome gives the worker back or replaces it: a refused clip returns it; a clip that ran it out of
memory, an unexpected error, a death (BrokenProcessPool), a deadline overrun or a worker that kept more
than half its allowance after an extraction (a leak) replace it in the background. A pool whose
replacements keep failing reports it (`failure`), which /readyz turns into 503.

The pool is started whole before the server is ready (procpool.py).
"""

from __future__ import annotations

import collections
import logging
import math
import os
import resource
import signal
import threading
import time
from collections.abc import Callable
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
from . import clip
from .features import ClipError, PromptEncoder

log = logging.getLogger(__name__)

# Where SCHED_IDLE is refused (not Linux, or a seccomp profile that forbids it): the lowest priority.
FALLBACK_NICE = 19
# The encoders' ONNX Runtime sessions and numpy's BLAS: one thread each, one core at most.
THREADS = 1
RESTART_RETRY_S = 5.0  # between attempts to start a replacement worker that failed to start

_encoder: PromptEncoder | None = None
_error: str | None = None
_baseline_rss = 0  # bytes resident once warm: what an extraction's growth is measured from


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


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _address_space() -> int:
    return int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _init(model_dir: str, memory_mib: int | None = None) -> None:
    global _encoder, _error, _baseline_rss
    try:
        _background()
        threadpool_limits(THREADS)
        m = validate_model_dir(Path(model_dir), "fp32")
        _encoder = PromptEncoder(Path(model_dir), m, TextFrontend.of_model(Path(model_dir), m.frontend), threads=THREADS)
        # One extraction now: the text normalizers and the sessions load before the server is ready, not
        # during the first registration (at this priority, on a busy CPU, that would take a minute).
        t = np.arange(24000) / 16000
        _encoder.extract((0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 16000, "Warm-up.")
        _baseline_rss = _rss()
        if memory_mib is not None:  # soft and hard: nothing in this process may raise it again
            limit = _address_space() + memory_mib * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
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


def _register(data: bytes, filename: str | None, media_type: str | None, transcript: str | None,
              name: str) -> tuple[Voice, clip.ClipFacts, int]:
    """The upload decoded and extracted: the voice, what the record keeps of the clip, and how many bytes this
    worker holds beyond its warm state afterwards (the pool replaces one that keeps too much)."""
    assert _encoder is not None, _error
    try:
        c = clip.decode(data, filename, media_type)
        voice = _encoder.extract(c.audio, c.sample_rate, transcript, name=name)
    except MemoryError:
        raise OutOfMemory() from None
    except Exception as exc:  # ONNX Runtime's allocation failures under the limit (its own exception types)
        if "bad_alloc" in str(exc) or "Failed to allocate" in str(exc):
            raise OutOfMemory() from None
        raise
    return voice, c.facts, _rss() - _baseline_rss


class ExtractionTimeout(Exception):
    """No worker was free, or the extraction did not finish, by the registration's deadline."""


class PoolClosed(Exception):
    """The server is stopping: no worker will take the registration."""


class WorkerDied(Exception):
    """The worker stopped during the extraction (killed for memory, say); a fresh one is starting."""


class ExtractionFailed(Exception):
    """The extraction raised something that is not about the clip (a broken model file, say); the message
    names it. The worker that raised it has been replaced."""


class OutOfMemory(clip.ClipRejected):
    """The clip needed more memory than the worker's address-space limit allows."""

    def __init__(self) -> None:
        super().__init__("Decoding and analysing the clip needed more memory than a voice registration may use; "
                         "send a shorter clip at a common rate (e.g. 10 s of 16-bit 48 kHz mono WAV).",
                         "audio_too_complex")

    def __reduce__(self):
        return type(self), ()


@dataclass(frozen=True, eq=False)
class _Slot:
    pool: ProcessPoolExecutor  # of one worker
    pid: int


class ExtractionPool:
    """`size` worker processes, each in a pool of its own, so that one whose extraction overruns its
    deadline (starved under SCHED_IDLE on a saturated CPU, or stuck) is killed and replaced without
    touching the others. `register` blocks (call it from a thread). `on_replace(reason)` is told of each
    replacement (timeout, died, memory, leak, error)."""

    def __init__(self, model_dir: Path, size: int, memory_mib: int | None = None,
                 on_replace: Callable[[str], None] | None = None) -> None:
        self.model_dir = str(model_dir)
        self.size = size
        self.memory_mib = memory_mib
        self.on_replace = on_replace or (lambda reason: None)
        self.busy = 0  # extractions running or waiting for a worker (counted on the event loop)
        self.failure: str | None = None  # why the last replacement could not start, until one does
        self._free: collections.deque[_Slot] = collections.deque()
        self._slots: set[_Slot] = set()  # every live worker, free or busy
        self._changed = threading.Condition()
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

    @property
    def live(self) -> int:
        """Workers running now, free or busy (fewer than `size` while replacements start)."""
        return len(self._slots)

    @property
    def unavailable(self) -> str | None:
        """Why no registration can be served (no worker left, and replacing them fails), or None."""
        return self.failure if not self._slots else None

    def _start(self) -> _Slot:
        pool, [pid] = start_pool(1, _init, (self.model_dir, self.memory_mib), _ready,
                                 "voice registration cannot start its feature extraction")
        return _Slot(pool, pid)

    def _add(self, slot: _Slot) -> None:
        with self._changed:
            if self._closed:
                slot.pool.shutdown(wait=False, cancel_futures=True)
                return
            self._slots.add(slot)
            self._free.append(slot)
            self._changed.notify()

    def _take(self, deadline: float) -> _Slot:
        with self._changed:
            while not self._free:
                if self._closed:
                    raise PoolClosed
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ExtractionTimeout
                self._changed.wait(None if left == math.inf else left)
            if self._closed:
                raise PoolClosed
            return self._free.popleft()

    def _give_back(self, slot: _Slot) -> None:
        with self._changed:
            if slot in self._slots:
                self._free.append(slot)
                self._changed.notify()

    def register(self, data: bytes, filename: str | None, media_type: str | None, transcript: str | None,
                 name: str, deadline: float = math.inf) -> tuple[Voice, clip.ClipFacts]:
        """The voice and the clip's facts, once a worker is free and has decoded and extracted the upload, by
        `deadline` (time.monotonic()) or ExtractionTimeout. A refused clip raises ClipRejected or ClipError
        (its `code` says why); PoolClosed, WorkerDied and ExtractionFailed say the rest."""
        slot = self._take(deadline)
        try:
            if time.monotonic() >= deadline:
                raise ExtractionTimeout
            future = slot.pool.submit(_register, data, filename, media_type, transcript, name)
            voice, facts, kept = future.result(None if deadline == math.inf else max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            self._replace(slot, "timeout", kill=True)  # its work is for nobody now; it would hold the slot
            raise ExtractionTimeout from None
        except BrokenProcessPool:
            if self._closed:  # close() killed it: the server is stopping
                raise PoolClosed from None
            self._replace(slot, "died")
            raise WorkerDied from None
        except OutOfMemory:
            self._replace(slot, "memory", kill=True)  # a failed allocation may have left its heap in pieces
            raise
        except (clip.ClipRejected, ClipError, ExtractionTimeout):
            self._give_back(slot)
            raise
        except Exception as exc:  # noqa: BLE001 (not the clip's doing: said, and the worker is not trusted again)
            self._replace(slot, "error", kill=True)
            raise ExtractionFailed(f"{exc.__class__.__name__}: {exc}") from None
        except BaseException:  # interrupted while waiting: the worker may still be busy with this clip
            self._replace(slot, "error", kill=True)
            raise
        if self.memory_mib is not None and kept > self.memory_mib * 2**20 // 2:
            log.warning("voice extraction worker %d keeps %d MiB after an extraction; replacing it", slot.pid,
                        kept >> 20)
            self._replace(slot, "leak", kill=True)
        else:
            self._give_back(slot)
        return voice, facts

    def _replace(self, slot: _Slot, reason: str, kill: bool = False) -> None:
        """A fresh worker for `slot`'s, started in the background: the registration that found it broken is
        answered now, and the next one waits (up to its deadline) for the replacement."""
        if kill:
            try:
                os.kill(slot.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        slot.pool.shutdown(wait=False, cancel_futures=True)
        with self._changed:
            self._slots.discard(slot)
            if slot in self._free:
                self._free.remove(slot)
        self.on_replace(reason)
        threading.Thread(target=self._restart, name="voice-worker-restart", daemon=True).start()

    def _restart(self) -> None:
        while not self._closed:
            try:
                self._add(self._start())
                self.failure = None
                return
            except Exception as exc:  # noqa: BLE001 (a full /tmp, a memory limit: try again, said in the log)
                self.failure = f"{exc.__class__.__name__}: {exc}"
                log.error("the voice extraction worker could not be restarted (%s); retrying in %g s", exc,
                          RESTART_RETRY_S)
                time.sleep(RESTART_RETRY_S)

    def close(self) -> None:
        """Stops every worker now, and answers registrations waiting for one (PoolClosed): an extraction still
        running is for nobody once the server stops."""
        with self._changed:
            self._closed = True
            slots, self._slots = self._slots, set()
            self._free.clear()
            self._changed.notify_all()
        for slot in slots:
            try:
                os.kill(slot.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            slot.pool.shutdown(wait=False, cancel_futures=True)
