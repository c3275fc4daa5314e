"""Worker process pools that are started whole and initialized before the server reports ready.

The pools use `spawn`: the server process runs threads and ONNX Runtime sessions, so forking it is unsafe.
A `spawn` pool starts its workers on demand (the second one during the second concurrent call, paying for
its imports then), so every worker is started up front and its initializer has run before a request needs it.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from .model.manifest import ModelLoadError


def start_pool(size: int, initializer: Callable, initargs: tuple, ready: Callable[[], tuple[int, str | None]],
               what: str) -> tuple[ProcessPoolExecutor, list[int]]:
    """`size` started workers and their pids. `ready` (a module-level function) answers in a worker with its
    pid and the error its initializer caught (None if none); any error stops start-up with ModelLoadError
    saying `what` could not start and why."""
    pool = ProcessPoolExecutor(size, mp_context=multiprocessing.get_context("spawn"), initializer=initializer,
                               initargs=initargs)
    # A spawn pool starts a worker per call submitted while none is idle, so `size` calls at once start
    # them all; a worker answers once its initializer is done, but a quick one may answer for a slow one.
    answers: dict[int, str | None] = {}
    while len(answers) < size:
        before = len(answers)
        answers |= dict(f.result() for f in [pool.submit(ready) for _ in range(size - len(answers))])
        if len(answers) == before:
            time.sleep(0.1)
    problem = next((error for error in answers.values() if error is not None), None)
    if problem is not None:
        pool.shutdown(cancel_futures=True)
        raise ModelLoadError(f"{what}: {problem}")
    return pool, list(answers)
