"""Voice feature extraction in a child process.

The synthesis stages are threads of the server process: they share its GIL. Extraction in another thread
of that process would hold the GIL in its Python and C-extension sections while the stage threads wait,
and a lower CPU priority for that thread would make it worse (a preempted low-priority thread holding the
GIL stalls every stage thread). A child process has its own interpreter; at a lower priority (`nice`) the
kernel gives the stage threads the CPU first, and nothing else is shared.

The pool is started with `spawn` (the server process runs threads and ONNX Runtime sessions: forking it is
unsafe), and its workers build their own `PromptEncoder` once.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from ..engine.pipeline import Voice
from ..frontend import TextFrontend
from ..model.manifest import ModelLoadError, validate_model_dir
from .features import PromptEncoder

# How much nicer than the server the workers run: the stage threads get the CPU first.
NICENESS = 10

_encoder: PromptEncoder | None = None
_error: str | None = None


def _lower_priority() -> None:
    """Every thread of this process, not only the calling one (Linux sets a nice value per thread): numpy's
    BLAS started its threads when the module was imported, before this runs."""
    tasks = Path("/proc/self/task")
    for tid in (int(t.name) for t in tasks.iterdir()) if tasks.is_dir() else [0]:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICENESS))
        except OSError:  # a thread that ended meanwhile
            pass


def _init(model_dir: str, threads: int) -> None:
    global _encoder, _error
    try:
        _lower_priority()
        m = validate_model_dir(Path(model_dir), "fp32")
        f = m.frontend
        frontend = TextFrontend(Path(model_dir) / f.tokenizer, f.max_text_tokens_per_segment,
                                f.min_text_tokens_per_segment, f.merge_text_tokens, f.text_frontend)
        _encoder = PromptEncoder(Path(model_dir), m, frontend, threads=threads)
        # One extraction now: the text normalizers and the sessions load before the server is ready, not
        # during the first registration (at this priority, on a busy CPU, that would take a minute).
        t = np.arange(24000) / 16000
        _encoder.extract((0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 16000, "Warm-up.")
    except Exception as exc:  # reported by `ready`, so start-up fails with the reason
        _error = f"{exc.__class__.__name__}: {exc}"


def _ready() -> str | None:
    return _error


def _extract(audio: np.ndarray, sample_rate: int, transcript: str | None, name: str) -> Voice:
    assert _encoder is not None, _error
    return _encoder.extract(audio, sample_rate, transcript, name=name)


class ExtractionPool:
    """`size` worker processes; `extract` blocks (call it from a thread)."""

    def __init__(self, model_dir: Path, size: int, threads: int) -> None:
        self.args = (str(model_dir), threads)
        self.size = size
        self.busy = 0  # extractions running or waiting for a worker (counted on the event loop)
        self.pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        """Starts a worker and waits for its encoder, so a model that cannot clone fails at start-up."""
        pool = ProcessPoolExecutor(self.size, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                   initargs=self.args)
        problem = pool.submit(_ready).result()
        if problem is not None:
            pool.shutdown(cancel_futures=True)
            raise ModelLoadError(f"voice registration cannot start its feature extraction: {problem}")
        return pool

    def extract(self, audio: np.ndarray, sample_rate: int, transcript: str | None, name: str) -> Voice:
        from concurrent.futures.process import BrokenProcessPool

        try:
            return self.pool.submit(_extract, audio, sample_rate, transcript, name).result()
        except BrokenProcessPool:  # a worker died (killed for memory, say): start fresh ones for the next call
            self.pool = self._start()
            raise

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
