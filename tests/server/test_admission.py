"""Admission is bounded exactly: a full running batch plus a full queue, and the next request is refused."""

from __future__ import annotations

import asyncio

import pytest

from cosyvoice_server.api.schemas import SpeechRequest
from cosyvoice_server.config import BUNDLED_MODEL, Settings
from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.metrics import Metrics
from cosyvoice_server.scheduling.request import Outcome
from cosyvoice_server.scheduling.scheduler import Overloaded, Scheduler, SchedulerConfig
from cosyvoice_server.state import ServerState


@pytest.fixture(scope="module")
def pipeline():
    return Pipeline(BUNDLED_MODEL, "cpu")


@pytest.mark.parametrize(("max_batch", "max_queue"), [(2, 3), (1, 0), (4, 0)])
async def test_admits_exactly_max_batch_size_plus_max_queue_size(pipeline, max_batch: int, max_queue: int) -> None:
    metrics = Metrics()
    # Stage threads not started: every admitted request stays in flight, as under a long burst.
    state = ServerState(Settings(), metrics, pipeline=pipeline,
                        scheduler=Scheduler(pipeline, SchedulerConfig(max_batch, 5.0, max_queue), metrics))
    sched = state.scheduler

    def request():
        return state.new_request(SpeechRequest(model="tts-1", input="Admission control."))

    admitted = [request() for _ in range(max_batch + max_queue)]
    for r in admitted:
        sched.submit(r)
    assert sched.inflight == max_batch + max_queue
    with pytest.raises(Overloaded) as refused:
        sched.submit(request())
    assert f"({max_batch + max_queue} requests in flight)" in str(refused.value)
    assert refused.value.retry_after_s >= 1
    assert sched.inflight == max_batch + max_queue  # the refused one holds nothing
    # one finishes (or its client leaves): exactly one slot opens
    admitted[0].cancel()
    sched.submit(request())
    with pytest.raises(Overloaded):
        sched.submit(request())


async def test_a_slot_is_held_while_the_text_is_normalised_and_given_back_if_nothing_is_submitted(pipeline) -> None:
    metrics = Metrics()
    state = ServerState(Settings(), metrics, pipeline=pipeline,
                        scheduler=Scheduler(pipeline, SchedulerConfig(1, 5.0, 1), metrics))
    sched = state.scheduler

    def request():
        return state.new_request(SpeechRequest(model="tts-1", input="Admission control."))

    with sched.admission() as submit:
        assert sched.inflight == 1 and not sched.idle()
        assert metrics.registry.get_sample_value("cosyvoice_inflight_requests") == 1
        first, second = request(), request()
        sched.submit(first)  # the second and last slot
        with pytest.raises(Overloaded):  # the held one counts: a third is refused before its text is read
            with sched.admission():
                pass
        submit(second)
        assert sched.inflight == 2
    assert sched.inflight == 2  # submitted: leaving the block gives nothing back
    with pytest.raises(Overloaded):
        sched.submit(request())
    for r in (first, second):
        r.cancel()
    with pytest.raises(ValueError):  # a bad input found after normalising: the slot is given back
        with sched.admission():
            raise ValueError("no speakable text")
    assert sched.inflight == 0 and sched.idle()
    assert metrics.registry.get_sample_value("cosyvoice_inflight_requests") == 0


async def test_a_request_normalising_its_text_when_everything_is_aborted_ends_the_same_way(pipeline) -> None:
    metrics = Metrics()
    state = ServerState(Settings(), metrics, pipeline=pipeline,
                        scheduler=Scheduler(pipeline, SchedulerConfig(2, 5.0, 0), metrics))
    sched = state.scheduler
    running = state.new_request(SpeechRequest(model="tts-1", input="Already running."))
    sched.submit(running)
    with sched.admission() as submit:
        assert sched.abort_all(Outcome.SHUTDOWN, "the drain timeout passed") == 2  # the running one and this one
        assert sched.normalising == 1 and not sched.idle()
        late = state.new_request(SpeechRequest(model="tts-1", input="Normalised after the deadline."))
        submit(late)
    assert sched.idle() and sched.inflight == 0
    await asyncio.sleep(0)  # push_done hands the end to the event loop
    for req in (running, late):
        done = req.out.get_nowait()
        assert (done.outcome, done.message) == (Outcome.SHUTDOWN, "the drain timeout passed")
