"""Fault injection into the real scheduler and tiny pipeline: a client hanging up while no LLM batch
runs, and a stage that raises, must fail at most the requests of the failing batch."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cosyvoice_server.api.schemas import SpeechRequest
from cosyvoice_server.config import Settings
from cosyvoice_server.metrics import Metrics
from cosyvoice_server.scheduling.request import Done, Outcome, RequestPhase
from cosyvoice_server.state import ServerState

LONG = "Fault injection keeps this request decoding for a good while. " * 4


@pytest.fixture
async def state():
    s = ServerState(Settings(device="cpu"), Metrics())
    await asyncio.to_thread(s.load)
    yield s
    await asyncio.to_thread(s.scheduler.stop)


def request(s: ServerState, text: str = "A short sentence.", voice: str | None = None, seed: int = 0):
    return s.new_request(SpeechRequest(model="tts-1", input=text, voice=voice, seed=seed))


async def outcome(s: ServerState, req, timeout: float = 60) -> tuple[Outcome, int]:
    """Reads the request to its end; returns its outcome and the samples it got."""
    samples = 0
    while not isinstance(item := await asyncio.wait_for(req.out.get(), timeout), Done):
        samples += len(item)
    return item.outcome, samples


async def wait_for(cond, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def full_length(s: ServerState, req) -> int:
    return len(req.tokens) * s.pipeline.manifest.samples_per_token


async def test_hang_up_while_no_llm_batch_runs_fails_nobody(state):
    """The deterministic repro: B has left the LLM and waits in the flow stage; A hangs up while it is
    still queued for the LLM, so the LLM loop wakes to an arrival that has already ended."""
    s = state
    gate = threading.Event()
    run = s.pipeline.flow.run
    s.pipeline.flow.run = lambda chunks: (gate.wait(30), run(chunks))[1]
    b = request(s, seed=1)
    s.scheduler.submit(b)
    await wait_for(lambda: b.phase is RequestPhase.DRAINING)
    a = request(s, seed=2)
    with s.scheduler._lock:  # the LLM thread cannot take A between its arrival and its hang-up
        s.scheduler.submit(a)
        a.cancel()
        assert a.outcome == Outcome.CANCELLED and s.scheduler.inflight == 1  # its slot is free at once
    await asyncio.sleep(0.2)  # the LLM thread now wakes to an empty queue
    gate.set()
    got, samples = await outcome(s, b)
    assert got == Outcome.OK and samples == full_length(s, b) > 0
    c = request(s, seed=3)  # and the LLM stage still works
    s.scheduler.submit(c)
    got, samples = await outcome(s, c)
    assert got == Outcome.OK and samples == full_length(s, c) > 0
    a.cancel()  # a handler's second cancel changes nothing
    assert a.outcome == Outcome.CANCELLED and s.scheduler.idle()


async def test_a_failing_prefill_fails_only_its_arrivals(state):
    s = state
    ys = [request(s, LONG, seed=i) for i in range(3)]
    for y in ys:
        s.scheduler.submit(y)
    await wait_for(lambda: all(len(y.tokens) > 0 for y in ys))  # all three decode in the running batch
    x = request(s, voice="bright", seed=9)
    prefill = s.pipeline.llm.prefill

    def faulty(seqs):
        if any(q.owner is x for q in seqs):
            raise RuntimeError("injected device error")
        return prefill(seqs)

    s.pipeline.llm.prefill = faulty
    with s.scheduler._lock:
        s.scheduler.submit(x)
    results = await asyncio.gather(outcome(s, x), *(outcome(s, y) for y in ys))
    assert results[0][0] == Outcome.FAILED
    for y, (got, samples) in zip(ys, results[1:]):
        assert got == Outcome.OK and samples == full_length(s, y) > 0


@pytest.mark.parametrize("stage", ["flow", "vocoder"])
async def test_a_failing_chunk_batch_fails_only_the_requests_in_it(state, stage):
    s = state
    engine = getattr(s.pipeline, stage)
    run = engine.run
    failed_batch: list = []

    def faulty(items):
        if not failed_batch:
            failed_batch.extend(getattr(s.scheduler, "_running", {}).get(stage, []) or ["unknown"])
            raise RuntimeError("injected device error")
        return run(items)

    reqs = [request(s, LONG if i % 2 else "Short one.", seed=i) for i in range(6)]
    for r in reqs[:3]:
        s.scheduler.submit(r)
    engine.run = faulty
    await asyncio.sleep(0.05)
    for r in reqs[3:]:
        s.scheduler.submit(r)
    results = await asyncio.gather(*(outcome(s, r) for r in reqs))
    failed = [r for r, (got, _) in zip(reqs, results) if got == Outcome.FAILED]
    assert failed and set(map(id, failed)) == set(map(id, failed_batch))
    for r, (got, samples) in zip(reqs, results):
        if r not in failed:
            assert got == Outcome.OK and samples == full_length(s, r) > 0
