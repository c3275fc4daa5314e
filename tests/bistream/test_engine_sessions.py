"""Bistream sessions in the continuous batch (bundled tiny model, real ONNX Runtime): parking and
rejoining beside whole-text requests, freeing a parked cache at once, the KV bound, deadlines that
suit long sessions, and the feed's edges."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import numpy as np
import pytest
from sessions import Session, feed, speak

from cosyvoice_server.api.schemas import SpeechRequest
from cosyvoice_server.scheduling.request import Done, FeedClosed, Outcome
from cosyvoice_server.scheduling.scheduler import Overloaded

TOL = 1e-4  # float differences of other batch compositions in the flow and vocoder
WORDS = "Streaming text arrives word by word while the model is already speaking the first part of it".split()


def gauge(state, name: str) -> float:
    return state.metrics.registry.get_sample_value(name) or 0.0


async def whole_text(state, text: str, seed: int) -> tuple[list[int], np.ndarray]:
    req = state.new_request(SpeechRequest(model="tts-1", input=text, seed=seed, stream=True))
    state.scheduler.submit(req)
    chunks = []
    while not isinstance(item := await asyncio.wait_for(req.out.get(), 60), Done):
        chunks.append(item)
    assert item.outcome == Outcome.OK
    return req.tokens, np.concatenate(chunks)


async def wait_for(cond, timeout: float = 30) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition not reached"
        await asyncio.sleep(0.005)


async def test_a_session_parks_and_rejoins_while_whole_text_requests_share_the_batch(tiny, serve, monkeypatch):
    state = serve(tiny)
    # long enough to still decode while the session's slow text arrives
    texts = [" ".join(["The first whole text request of this test."] * 4),
             " ".join(["A second one, somewhat longer than the first one is."] * 4), "Third."]
    alone = [await whole_text(state, t, 10 + i) for i, t in enumerate(texts)]
    session_alone = await speak(state, [w + " " for w in WORDS], seed=3)

    rows = []  # per LLM step: (sessions, whole-text requests) in the batch
    step = tiny.llm.step

    def counting_step(batch):
        rows.append((sum(q.bistream is not None for q in batch.seqs), sum(q.bistream is None for q in batch.seqs)))
        return step(batch)

    monkeypatch.setattr(tiny.llm, "step", counting_step)
    parked_seen = []
    req = state.new_bistream_request(None, seed=3)
    state.scheduler.submit(req)
    session = Session(req)
    collecting = asyncio.create_task(session.collect())

    async def slow_feed():
        for w in WORDS:  # slower than the model: the session waits for text between groups
            req.text.push(w + " ")
            await asyncio.sleep(0.08)
            parked_seen.append(gauge(state, "cosyvoice_stream_parked_sessions"))
        req.text.end()

    together = await asyncio.gather(slow_feed(), *[whole_text(state, t, 10 + i) for i, t in enumerate(texts)])
    await collecting
    assert session.done.outcome == Outcome.OK
    assert max(parked_seen) == 1  # it left the batch for text at least once
    assert any(s and w for s, w in rows)  # and shared decode steps with whole-text requests
    for (tokens, audio), (tokens_alone, audio_alone) in zip(together[1:], alone):
        assert tokens == tokens_alone
        assert audio.shape == audio_alone.shape and np.abs(audio - audio_alone).max() <= TOL
    assert req.tokens == session_alone.req.tokens  # the session's own output does not depend on timing either
    assert session.audio.shape == session_alone.audio.shape
    assert np.abs(session.audio - session_alone.audio).max() <= TOL
    assert gauge(state, "cosyvoice_stream_parked_sessions") == 0 and gauge(state, "cosyvoice_stream_parked_kv_bytes") == 0


async def test_a_disconnect_while_parked_frees_its_kv_cache_at_once(tiny, serve):
    state = serve(tiny)
    sched = state.scheduler
    req = state.new_bistream_request(None, seed=1)
    sched.submit(req)
    req.text.push(" ".join(WORDS[:6]) + " ")
    # it decodes its groups, asks for more text and parks with its cache
    await wait_for(lambda: gauge(state, "cosyvoice_stream_parked_kv_bytes") > 0)
    held = gauge(state, "cosyvoice_stream_parked_kv_bytes")
    assert held % tiny.llm.kv_bytes_per_position == 0 and held // tiny.llm.kv_bytes_per_position > 20
    req.cancel()  # the handler's reaction to a closed connection
    assert gauge(state, "cosyvoice_stream_parked_kv_bytes") == 0
    assert gauge(state, "cosyvoice_stream_parked_sessions") == 0
    assert sched.inflight == 0 and not sched.parked
    req.text.push("more text nobody waits for ")  # a late delta from the handler is harmless
    tokens, _ = await whole_text(state, "The server carries on.", 1)
    assert tokens


async def test_a_session_over_its_kv_bound_ends_with_a_clear_reason_and_others_go_on(tiny, serve):
    limit_positions = 200  # a segment of five words needs about 150 here; all of the text about 1100
    state = serve(tiny, session_kv_limit_bytes=limit_positions * tiny.llm.kv_bytes_per_position)
    short = await speak(state, ["Short enough."], seed=2)
    assert short.done.outcome == Outcome.OK
    long = await speak(state, [w + " " for w in WORDS * 3], seed=2, pause_s=0.001)
    assert long.done.outcome == Outcome.LIMIT
    assert "200 positions" in long.done.message and "flush" in long.done.message
    assert state.scheduler.inflight == 0 and gauge(state, "cosyvoice_stream_parked_kv_bytes") == 0
    # the same text with a flush every few words fits: each segment starts a new cache
    parts = []
    for i, w in enumerate(WORDS * 3):
        parts += [w + " "] + ([None] if i % 5 == 4 else [])
    flushed = await speak(state, parts, seed=2)
    assert flushed.done.outcome == Outcome.OK and len(flushed.segments) == parts.count(None) + 1


async def test_waiting_for_text_has_no_deadline_but_text_must_become_audio_in_time(tiny, serve, monkeypatch):
    # the deadline leaves a loaded 2-core CI machine room to speak one short sentence
    state = serve(tiny, settings={"request_timeout_s": 3.0})
    req = state.new_bistream_request(None, seed=4)
    state.scheduler.submit(req)
    s = Session(req)
    collecting = asyncio.create_task(s.collect())
    req.text.push("A session that thinks for a while ")
    await asyncio.sleep(4.0)  # more than the request timeout, waiting on its client
    await feed(req, ["before it goes on."])
    await collecting
    assert s.done.outcome == Outcome.OK and len(s.segments) == 1

    step = tiny.llm.step
    # an overloaded server: the sentence needs well over 60 steps, 0.1 s each
    monkeypatch.setattr(tiny.llm, "step", lambda batch: (time.sleep(0.1), step(batch)))
    slow = await speak(state, [" ".join(WORDS) + "."], seed=4)
    assert slow.done.outcome == Outcome.TIMEOUT
    assert "3 s" in slow.done.message
    assert state.scheduler.inflight == 0


async def test_segments_usage_and_the_feeds_edges(tiny, serve):
    state = serve(tiny)
    s = await speak(state, ["   ", None, "One thought.", None, None, "Another", " one."], seed=6)
    assert s.done.outcome == Outcome.OK
    assert [seg.segment for seg in s.segments] == [0, 1]  # empty flushes make no segment
    enc = state.pipeline.frontend.encode
    assert [seg.text_tokens for seg in s.segments] == [len(enc("One thought.")), len(enc("Another one."))]
    for seg, audio in zip(s.segments, s.segment_audio):
        assert seg.speech_tokens > 0 and seg.audio_seconds == pytest.approx(len(audio) / 24000)
        assert seg.text_at <= seg.first_audio_at <= seg.done_at and seg.closed_at <= seg.done_at
    assert sum(seg.speech_tokens for seg in s.segments) == len(s.req.tokens)
    assert [s.req.text.info(i).chars for i in (0, 1)] == [len("One thought."), len("Another one.")]
    assert s.req.text.closed_segments == 2
    with pytest.raises(FeedClosed):
        s.req.text.push("late")
    with pytest.raises(FeedClosed):
        s.req.text.flush()
    s.req.text.end()  # a second end is harmless

    nothing = await speak(state, [], seed=6)  # opened and closed without text
    assert nothing.done.outcome == Outcome.OK and not nothing.segments and not nothing.chunks
    after_flush = await speak(state, ["Flushed, then ended.", None], seed=6)
    assert after_flush.done.outcome == Outcome.OK and len(after_flush.segments) == 1


async def test_sessions_count_for_admission_and_unknown_voices_are_refused(tiny, serve):
    state = serve(tiny, max_batch_size=1, max_queue_size=1)
    open_ = [state.new_bistream_request(None) for _ in range(2)]
    for r in open_:
        state.scheduler.submit(r)  # waiting for text, but admitted: they count
    with pytest.raises(Overloaded):
        state.scheduler.submit(state.new_bistream_request(None))
    for r in open_:
        r.cancel()
    with pytest.raises(ValueError, match="unknown voice"):
        state.new_bistream_request("no-such-voice")
    with pytest.raises(ValueError, match="instructions"):  # the tiny model's tokenizer has no <|endofprompt|>
        state.new_bistream_request(None, instructions="Whisper.")


async def test_long_text_without_sentence_ends_fits_the_flow_noise_buffer(tiny, serve, monkeypatch):
    monkeypatch.setattr(tiny.flow, "noise", tiny.flow.noise[:, :400])  # room for 200 speech tokens per segment
    state = serve(tiny)
    run_on = "word " * 60  # 300 text tokens and no sentence end: a segment allowed 20 speech tokens each
    whole, session = await asyncio.gather(whole_text(state, run_on, 5), speak(state, [run_on], seed=5))
    assert 0 < len(whole[0]) <= 200  # the whole-text path's one segment is bounded by the buffer too
    assert session.done.outcome == Outcome.OK
    assert len(session.segments) > 1 and all(seg.auto for seg in session.segments[:-1])
    assert all(0 < seg.speech_tokens <= 200 for seg in session.segments)
    assert sum(seg.text_tokens for seg in session.segments) == len(tiny.frontend.encode(run_on.strip()))
    await wait_for(lambda: state.scheduler.inflight == 0)  # a finished session's slot is freed just after its Done


async def test_a_voice_whose_prompt_fills_the_flow_fails_alone_and_its_batch_mates_go_on(tiny, serve, monkeypatch):
    monkeypatch.setattr(tiny.flow, "noise", tiny.flow.noise[:, :400])
    state = serve(tiny, max_queue_delay_ms=3000)  # a flow batch waits for every request still in the LLM
    warm = tiny.voices["warm"]
    reps = 210 // len(warm.prompt_speech_tokens) + 1  # a prompt longer than the buffer's 200 tokens
    huge = replace(warm, name="huge", prompt_speech_tokens=np.tile(warm.prompt_speech_tokens, reps),
                   prompt_mel=np.tile(warm.prompt_mel, (reps, 1)))
    doomed = state.new_request(SpeechRequest(model="tts-1", input="Hi there.", seed=1, stream=True), huge)
    state.scheduler.submit(doomed)
    mate = asyncio.create_task(whole_text(state, "Hi.", 2))
    while not isinstance(item := await asyncio.wait_for(doomed.out.get(), 60), Done):
        pass
    assert item.outcome == Outcome.FAILED
    assert "noise buffer is 400 mel frames" in item.message and f"{len(huge.prompt_speech_tokens)} prompt" in item.message
    tokens, audio = await mate  # asserts its own outcome is OK
    assert tokens and len(audio)
    session = await speak(state, ["Some words."], voice=huge, seed=1)
    assert session.done.outcome == Outcome.FAILED and "noise buffer" in session.done.message
    assert state.scheduler.inflight == 0


async def test_text_with_nothing_to_say_makes_no_segment(tiny, serve):
    state = serve(tiny)
    s = await speak(state, ["\U0001f642\U0001f44d\U0001f3fd !!! ", None, "\u200b\u200c\u200d\ufeff", None, "Real",
                            "\u200b words.", None, "\u2026?!"], seed=6)
    assert s.done.outcome == Outcome.OK
    assert [seg.text_tokens for seg in s.segments] == [len(state.pipeline.frontend.encode("Real words."))]
    assert s.req.text.info(0).chars == len("Real words.")
    nothing = await speak(state, ["\U0001f642\U0001f642 ... ", None, "\u200b\u200d", "\u2014"], seed=6)
    assert nothing.done.outcome == Outcome.OK and not nothing.segments and not nothing.chunks  # as an empty session
