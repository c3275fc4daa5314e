"""The stage queue's batching: one item per request per batch, the most urgent first (arrival order among
equals), no wait when nothing more can come, a bounded wait while other requests are upstream; and the batch
limit measured by doubling."""

from __future__ import annotations

import threading
import time

import pytest

from cosyvoice_server.scheduling.batching import StageQueue, WorkItem, paying_batch


class Req:
    """A request identity (the queue groups by object identity)."""


def queue_of(*items: tuple[Req, str]) -> StageQueue:
    q = StageQueue()
    for req, payload in items:
        q.put(WorkItem(req, payload))
    return q


def test_a_batch_takes_one_item_per_request_in_arrival_order() -> None:
    a, b, c = Req(), Req(), Req()
    q = queue_of((a, "a1"), (a, "a2"), (b, "b1"), (c, "c1"), (b, "b2"))
    batch = q.take_batch(8, 0.0, lambda: set())
    assert [i.payload for i in batch] == ["a1", "b1", "c1"]  # a request's chunks stay in order
    assert len(q) == 2
    assert [i.payload for i in q.take_batch(8, 0.0, lambda: set())] == ["a2", "b2"]
    assert len(q) == 0


def test_a_full_batch_goes_at_once_and_leaves_the_rest_queued() -> None:
    reqs = [Req() for _ in range(5)]
    q = queue_of(*[(r, str(i)) for i, r in enumerate(reqs)])
    t0 = time.monotonic()
    batch = q.take_batch(3, 10.0, lambda: {id(Req())})  # others upstream, but the batch is full
    assert time.monotonic() - t0 < 1.0
    assert [i.payload for i in batch] == ["0", "1", "2"] and len(q) == 2


def test_a_lone_request_goes_at_once_when_nothing_else_is_upstream() -> None:
    a = Req()
    q = queue_of((a, "a1"))
    t0 = time.monotonic()
    assert [i.payload for i in q.take_batch(8, 10.0, lambda: {id(a)})] == ["a1"]  # upstream is a itself
    assert time.monotonic() - t0 < 1.0


def test_a_partial_batch_waits_for_upstream_requests_but_not_past_the_delay() -> None:
    a, other = Req(), Req()
    q = queue_of((a, "a1"))
    t0 = time.monotonic()
    batch = q.take_batch(8, 0.2, lambda: {id(a), id(other)})
    waited = time.monotonic() - t0
    assert [i.payload for i in batch] == ["a1"]
    assert 0.18 <= waited < 0.9


def test_a_wake_up_during_the_wait_does_not_restart_the_delay() -> None:
    a, b, c, other = Req(), Req(), Req(), Req()
    q = queue_of((a, "a1"))
    threading.Timer(0.2, lambda: q.put(WorkItem(b, "b1"))).start()  # wakes the taker; `other` is still upstream
    t0 = time.monotonic()
    batch = q.take_batch(8, 0.4, lambda: {id(a), id(b), id(c), id(other)})
    assert [i.payload for i in batch] == ["a1", "b1"]
    assert time.monotonic() - t0 < 0.65  # 0.4 s from the oldest item, not 0.4 s from the wake-up


def test_work_arriving_during_the_wait_joins_the_batch() -> None:
    a, b = Req(), Req()
    q = queue_of((a, "a1"))
    upstream = {id(a), id(b)}
    threading.Timer(0.1, lambda: q.put(WorkItem(b, "b1"))).start()
    batch = q.take_batch(8, 5.0, lambda: upstream)
    assert [i.payload for i in batch] == ["a1", "b1"]  # b's item completes the expected set: no further wait


def test_poke_re_evaluates_when_an_upstream_request_finishes() -> None:
    a, b = Req(), Req()
    q = queue_of((a, "a1"))
    upstream = {id(a), id(b)}

    def b_finishes() -> None:
        upstream.discard(id(b))
        q.poke()

    threading.Timer(0.1, b_finishes).start()
    t0 = time.monotonic()
    assert [i.payload for i in q.take_batch(8, 5.0, lambda: upstream)] == ["a1"]
    assert time.monotonic() - t0 < 2.0


def test_an_empty_queue_blocks_until_work_arrives() -> None:
    a = Req()
    q = StageQueue()
    threading.Timer(0.1, lambda: q.put(WorkItem(a, "late"))).start()
    assert [i.payload for i in q.take_batch(8, 0.0, lambda: set())] == ["late"]


def test_close_flushes_what_is_queued_then_returns_none() -> None:
    a, other = Req(), Req()
    q = queue_of((a, "a1"))
    q.close()
    t0 = time.monotonic()
    assert [i.payload for i in q.take_batch(8, 10.0, lambda: {id(a), id(other)})] == ["a1"]  # no waiting
    assert time.monotonic() - t0 < 1.0
    assert q.take_batch(8, 10.0, lambda: set()) is None


def test_close_wakes_a_taker_blocked_on_an_empty_queue() -> None:
    q = StageQueue()
    threading.Timer(0.1, q.close).start()
    assert q.take_batch(8, 0.0, lambda: set()) is None


@pytest.mark.parametrize("max_batch", [1, 2])
def test_max_batch_bounds_every_batch(max_batch: int) -> None:
    reqs = [Req() for _ in range(3)]
    q = queue_of(*[(r, str(i)) for i, r in enumerate(reqs)])
    sizes = []
    while len(q):
        sizes.append(len(q.take_batch(max_batch, 0.0, lambda: set())))
    assert max(sizes) == max_batch and sum(sizes) == 3


def test_the_most_urgent_request_goes_first_and_a_requests_own_chunks_stay_in_order() -> None:
    """Due = when the listener runs out of audio: a request with none yet (due since it arrived) goes before
    requests that are already playing, whatever the queue order."""
    playing, fresh, later = Req(), Req(), Req()
    q = StageQueue()
    q.put(WorkItem(playing, "playing 2nd chunk", due=lambda: 105.0))
    q.put(WorkItem(playing, "playing 3rd chunk", due=lambda: 104.0))  # never before its own earlier chunk
    q.put(WorkItem(later, "later 1st chunk", due=lambda: 101.0))
    q.put(WorkItem(fresh, "fresh 1st chunk", due=lambda: 100.0))
    assert [i.payload for i in q.take_batch(1, 0.0, lambda: set())] == ["fresh 1st chunk"]
    assert [i.payload for i in q.take_batch(2, 0.0, lambda: set())] == ["later 1st chunk", "playing 2nd chunk"]
    assert [i.payload for i in q.take_batch(2, 0.0, lambda: set())] == ["playing 3rd chunk"]


def test_a_requests_later_chunks_lose_their_urgency_once_its_first_is_out() -> None:
    """Chunks queued before a request's first mel came out were due since it arrived; when it comes out, the
    listener has audio to play, and another request's first chunk goes before them."""
    class Playing(Req):
        def __init__(self, created: float) -> None:
            super().__init__()
            self.created, self.first_mel_at, self.mel_seconds = created, None, 0.0

        def due(self) -> float:
            return self.created if self.first_mel_at is None else self.first_mel_at + self.mel_seconds

    a, b = Playing(100.0), Playing(101.0)
    q = StageQueue()
    q.put(WorkItem(a, "a 1st chunk", a.due))
    q.put(WorkItem(a, "a last chunk", a.due))  # LLM done before a's first chunk was through the flow
    q.put(WorkItem(b, "b 1st chunk", b.due))
    assert [i.payload for i in q.take_batch(1, 0.0, lambda: set())] == ["a 1st chunk"]
    a.first_mel_at, a.mel_seconds = 110.0, 2.0  # its first chunk is out: 2 s to play from 110
    assert [i.payload for i in q.take_batch(1, 0.0, lambda: set())] == ["b 1st chunk"]
    assert [i.payload for i in q.take_batch(1, 0.0, lambda: set())] == ["a last chunk"]


@pytest.mark.parametrize(("cost", "limit", "want"), [
    (lambda b: 1.0 * b, 16, 1),  # linear (a large model on CPU): batching buys nothing
    (lambda b: 1.0 + 0.05 * b, 16, 16),  # fixed overhead dominates (a GPU, a tiny model): up to the limit
    (lambda b: 1.0 if b <= 4 else 1.0 * b, 16, 4),  # pays until the device is full, then stops
    (lambda b: 1.0, 6, 4),  # never past the limit
])
def test_the_batch_limit_is_the_largest_doubling_that_still_paid(cost, limit, want) -> None:
    size, times = paying_batch(cost, limit)
    assert size == want
    assert times[1] == cost(1) and max(times) <= limit
