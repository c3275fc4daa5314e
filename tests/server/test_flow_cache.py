"""The flow caches' memory bound: one ledger for every streamed segment, a cache that would pass the limit
is dropped (its segment re-runs its prefix), and released or dropped caches give their bytes back."""

from __future__ import annotations

import numpy as np

from cosyvoice_server.engine.flow import CacheLedger, FlowCache


def _arrays(frames: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((2, 2, 3, frames, 4), np.float32), np.zeros((2, 2, 1, 4, 2), np.float32)


def test_caches_grow_within_the_limit_and_give_their_bytes_back() -> None:
    past, conv = _arrays(50)
    ledger = CacheLedger(limit_bytes=3 * (past.nbytes + conv.nbytes))
    a, b = FlowCache(ledger), FlowCache(ledger)
    assert ledger.store(a, past, conv, 50) and a.frames == 50
    assert ledger.store(b, past, conv, 50)
    assert ledger.used == a.counted + b.counted == 2 * (past.nbytes + conv.nbytes)
    grown = _arrays(100)
    assert ledger.store(a, *grown, 100)  # a grows in place of its old arrays, not beside them
    assert ledger.used == a.counted + b.counted
    a.release()
    assert a.closed and a.past is None and ledger.used == b.counted
    a.release()  # twice (its last chunk and its request's end): counted once
    assert ledger.used == b.counted
    b.release()
    assert ledger.used == 0


def test_a_cache_past_the_limit_is_dropped_and_stays_dropped() -> None:
    past, conv = _arrays(50)
    ledger = CacheLedger(limit_bytes=past.nbytes + conv.nbytes)
    a, b = FlowCache(ledger), FlowCache(ledger)
    assert ledger.store(a, past, conv, 50)
    assert not ledger.store(b, past, conv, 50)  # no room: b's segment re-runs its prefix from now on
    assert b.closed and b.frames == 0 and ledger.used == a.counted
    assert not ledger.store(a, *_arrays(100), 100)  # growing past the limit drops a too, and frees it
    assert a.closed and ledger.used == 0
    assert not ledger.store(a, past, conv, 50)  # a dropped cache takes nothing more
    assert ledger.used == 0
