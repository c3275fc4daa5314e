"""Request text normalization and segmentation in worker processes, off the event loop.

wetext's normalizers compose and search their FSTs in kaldifst calls that hold the GIL for the whole text
(about 0.8 s for a 4096-character input on one core). In a thread of the server process they would still
stop the event loop for that long, and with it every other request's audio and the probes, and take the
GIL from the stage threads. A worker process has its own interpreter; what crosses is the text and its
segments' token ids. Workers run at the server's priority: the text is on the request's path to its
first audio. Each worker normalizes both an English and a Chinese text before the server is ready, so
no request pays for loading the FSTs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from .frontend import Spoken, TextFrontend
from .pronunciation.plan import Part, Pause, Plan
from .procpool import start_pool

log = logging.getLogger(__name__)

# Texts longer than this (about 0.1 s of normalization on one core) take at most all workers but one, so
# that a short text never waits behind long ones for a worker.
LONG_TEXT_CHARS = 512

WARM_UP = ("Warm-up at 10:30, 3 items.", "预热于2024年1月3日。")

_frontend: TextFrontend | None = None
_error: str | None = None


def _init(model_dir: str, spec) -> None:
    global _frontend, _error
    try:
        _frontend = TextFrontend.of_model(Path(model_dir), spec)
        for text in WARM_UP:
            _frontend.segments(text)
    except Exception as exc:  # reported by `_ready`, so start-up fails with the reason
        _error = f"{exc.__class__.__name__}: {exc}"


def _ready() -> tuple[int, str | None]:
    return os.getpid(), _error


def _segments(text: str) -> list[np.ndarray]:
    assert _frontend is not None, _error
    return _frontend.segments(text)


def _plan_segments(plan: Plan) -> list[Spoken | Pause]:
    assert _frontend is not None, _error
    return _frontend.plan_segments(plan)


def _call_soon(loop: asyncio.AbstractEventLoop, fn) -> None:
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # the loop has closed (the server stopped): nobody waits any more
        pass


class TextWorkers:
    """`size` worker processes computing `TextFrontend.segments` of the model in `model_dir` (`spec`: its
    manifest's frontend section)."""

    def __init__(self, model_dir: Path, spec, size: int) -> None:
        self._args = (str(model_dir), spec)
        self.size = size
        self.pool = self._start()
        self._restart = asyncio.Lock()
        self._long = asyncio.Semaphore(max(1, size - 1))

    def _start(self) -> ProcessPoolExecutor:
        return start_pool(self.size, _init, self._args, _ready, "the text normalization workers cannot start")[0]

    async def segments(self, text: str) -> list[np.ndarray]:
        """The text's LLM segments. Cancelling the caller drops a call that has not started; one that has
        finishes in its worker and its result is discarded (nothing is held for it). BrokenProcessPool when
        a worker died (killed for memory, say): fresh workers are started for the texts after it."""
        return await self._call(_segments, text, len(text))

    async def plan(self, plan: Plan) -> list[Spoken | Pause]:
        """A plan's segments and pauses (TextFrontend.plan_segments), as `segments`."""
        chars = sum(len(r.text) for part in plan if isinstance(part, Part) for r in part.runs)
        return await self._call(_plan_segments, plan, chars)

    async def _call(self, fn, arg, chars: int):
        loop = asyncio.get_running_loop()
        long = chars > LONG_TEXT_CHARS and self.size > 1
        if long:
            await self._long.acquire()
        pool = self.pool
        try:
            try:
                work = pool.submit(fn, arg)
            except BaseException:
                if long:
                    self._long.release()
                raise
            if long:  # held until its worker is done with it, even when the caller has given up
                work.add_done_callback(lambda _: _call_soon(loop, self._long.release))
            return await asyncio.wrap_future(work)
        except BrokenProcessPool:
            async with self._restart:  # every call on the broken pool fails; the first one replaces it
                if self.pool is pool:
                    log.error("a text normalization worker stopped; starting fresh ones")
                    self.pool = await asyncio.to_thread(self._start)
            raise

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
