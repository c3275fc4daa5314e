"""The batching decisions for the flow and vocoder stages, and the queue that applies them.

A stage never waits for a batch when nothing more can come: it runs at once if the batch is full, or
if every request that could still send it work is already represented in the queue (an idle server
answers a lone request with no added delay). Only while other requests are still upstream may a
partial batch wait, and then at most `max_queue_delay` from its oldest item.

A batch takes the most urgent work first: each item is due when its request's listener would run out of
audio (a request with no audio yet is due since it arrived), so first chunks go before other requests'
later ones. How large a batch may grow is measured, not assumed: where a stage's time grows with its
batch as fast as the batch does (a large model on CPU), batching adds latency and no throughput.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable
from typing import Any


def should_dispatch(ready: int, max_batch: int, expected_more: int, waited_s: float, max_delay_s: float) -> bool:
    """ready: items that can go in this batch; expected_more: requests upstream with nothing queued here."""
    if ready == 0:
        return False
    return ready >= max_batch or expected_more <= 0 or waited_s >= max_delay_s


BATCH_GAIN = 1.6  # a doubled batch pays if it runs in at most this times the time (25 % more items per second)


def paying_batch(cost: Callable[[int], float], limit: int, gain: float = BATCH_GAIN) -> tuple[int, dict[int, float]]:
    """The largest batch, doubling from 1 up to `limit`, whose every doubling took at most `gain` times as
    long as the batch before it; and the measured `cost(batch)` seconds."""
    times = {1: cost(1)}
    b = 1
    while b * 2 <= limit:
        times[b * 2] = cost(b * 2)
        if times[b * 2] > gain * times[b]:
            break
        b *= 2
    return b, times


def _always_due() -> float:
    return 0.0


@dataclass
class WorkItem:
    request: Any
    payload: Any
    # When its request's listener runs out of audio (monotonic s), asked when a batch is picked: it moves
    # as the request's earlier chunks come out. Earlier goes first.
    due: Callable[[], float] = _always_due
    enqueued: float = field(default_factory=time.monotonic)


def pick(items: Iterable[WorkItem], max_batch: int) -> list[WorkItem]:
    """Each request's oldest item (a request's chunks run in order), the earliest due first, then the
    earliest queued; at most `max_batch`."""
    heads: dict[int, WorkItem] = {}
    for item in items:
        heads.setdefault(id(item.request), item)
    return sorted(heads.values(), key=lambda i: (i.due(), i.enqueued))[:max_batch]


class StageQueue:
    """Work items; a batch takes at most one item per request so each request's chunks are processed in
    order, and the most urgent requests' first (`pick`)."""

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
                cands = pick(self._items, max_batch)
                queued = {id(i.request) for i in self._items}
                waited = time.monotonic() - self._items[0].enqueued
                expected = len(upstream() - queued)
                if self._closed or should_dispatch(len(cands), max_batch, expected, waited, max_delay_s):
                    for item in cands:
                        self._items.remove(item)
                    return cands
                self._cond.wait(max(0.0, max_delay_s - waited))
