"""The batching decision for the flow and vocoder stages, and the queue that applies it.

A stage never waits for a batch when nothing more can come: it runs at once if the batch is full, or
if every request that could still send it work is already represented in the queue (an idle server
answers a lone request with no added delay). Only while other requests are still upstream may a
partial batch wait, and then at most `max_queue_delay` from its oldest item.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable


def should_dispatch(ready: int, max_batch: int, expected_more: int, waited_s: float, max_delay_s: float) -> bool:
    """ready: items that can go in this batch; expected_more: requests upstream with nothing queued here."""
    if ready == 0:
        return False
    return ready >= max_batch or expected_more <= 0 or waited_s >= max_delay_s


@dataclass
class WorkItem:
    request: Any
    payload: Any
    enqueued: float = field(default_factory=time.monotonic)


class StageQueue:
    """A FIFO of work items; a batch takes at most one item per request so each request's chunks are
    processed in order."""

    def __init__(self) -> None:
        self._items: deque[WorkItem] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: WorkItem) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def poke(self) -> None:
        """Wakes a waiting taker so it re-evaluates `expected_more` (a request upstream finished)."""
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _candidates(self, max_batch: int) -> list[WorkItem]:
        seen: set[int] = set()
        out = []
        for item in self._items:
            if id(item.request) not in seen:
                seen.add(id(item.request))
                out.append(item)
                if len(out) == max_batch:
                    break
        return out

    def take_batch(self, max_batch: int, max_delay_s: float, upstream: Callable[[], set[int]]) -> list[WorkItem] | None:
        """Blocks until a batch should run; None once closed and empty. `upstream` gives the ids of
        requests that may still send work to this stage."""
        with self._cond:
            while True:
                if not self._items:
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                cands = self._candidates(max_batch)
                queued = {id(i.request) for i in self._items}
                waited = time.monotonic() - self._items[0].enqueued
                expected = len(upstream() - queued)
                if self._closed or should_dispatch(len(cands), max_batch, expected, waited, max_delay_s):
                    for item in cands:
                        self._items.remove(item)
                    return cands
                self._cond.wait(max(0.0, max_delay_s - waited))
