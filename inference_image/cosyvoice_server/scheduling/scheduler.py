"""The three-stage scheduler: continuous batching for the LLM, chunk batching for flow and vocoder.

Each stage runs in its own thread, so the GPU (or CPU cores) overlap LLM decode steps with flow and
vocoder work for earlier chunks. The LLM batch changes between decode steps: waiting requests join
(prefilled together, then merged into the running KV cache) and finished, cancelled or expired ones
leave. Admission is bounded; a full server answers 429 at once instead of queueing without limit.

Bistream sessions (text arriving while they run) share the same batch: a segment that asks for text
(the fill token) with too little buffered leaves the batch with a copy of its KV cache ("parked": a
cache, no batch slot) and rejoins when its text arrives, its next input block run over its own cache
like a prefill, then merged back. Its speech tokens stream through the flow and vocoder batches like a
streamed whole-text request's; a flush ends the segment, and later text starts a new one. A segment
whose cache would pass `session_kv_limit_bytes` ends the session with Outcome.LIMIT.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..engine.bistream import Phase as InputPhase
from ..engine.flow import FlowChunk, VocoderInput
from ..engine.llm import Batch, Sequence
from ..engine.pipeline import Pipeline
from ..config import Settings
from ..metrics import Metrics
from ..streaming import Span, drop_silence, seams_of
from .batching import StageQueue, WorkItem
from .planning import Admission, ParkedView, RowView, admit, settle
from .request import Done, Outcome, RequestPhase, SegmentDone, SegmentEnd, SynthesisRequest

log = logging.getLogger(__name__)
MIB = 1 << 20

WAITING, RUNNING, PARKED, DRAINING = (RequestPhase.WAITING, RequestPhase.RUNNING, RequestPhase.PARKED,
                                      RequestPhase.DRAINING)
LLM_PHASES = (WAITING, RUNNING)  # requests that may still send chunks to the flow stage


class Overloaded(Exception):
    """No slot for one more request of its kind; `code` says which bound was reached (see `refusal`)."""

    def __init__(self, retry_after_s: int, capacity: int, code: str = "server_overloaded",
                 share: int = 0) -> None:
        reason = {
            "server_overloaded": f"the server is at capacity ({capacity} requests in flight)",
            "session_share_full": f"WebSocket sessions hold all {share} of the {capacity} slots they may take (the "
                                  "rest is kept for HTTP requests)",
            "http_share_full": f"HTTP requests hold all {share} of the {capacity} slots they may take (the rest is "
                               "kept for WebSocket sessions)",
        }[code]
        super().__init__(f"{reason}; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s
        self.code = code


def _default(setting: str):
    return Settings.model_fields[setting].default


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's part of the server's settings (config.py defines them and their defaults)."""

    max_batch_size: int = _default("max_batch_size")
    max_queue_delay_ms: float = _default("max_queue_delay_ms")
    max_queue_size: int = _default("max_queue_size")
    # one bistream session's KV cache (its text since the last flush)
    session_kv_limit_bytes: int = int(_default("stream_max_kv_mib") * MIB)
    http_reserved_share: float = _default("http_reserved_share")  # of the capacity, what sessions may not take
    stream_reserved_share: float = _default("stream_reserved_share")  # of the capacity, what HTTP requests may not take
    flow_max_batch: int = _default("max_batch_size")  # chunks per flow run (resolved: never 0)
    vocoder_max_batch: int = _default("max_batch_size")

    @classmethod
    def from_settings(cls, s: Settings, measured: dict[str, int] | None = None) -> SchedulerConfig:
        """`measured`: the stages' paying batch sizes (scheduling/probe.py), for those set to 0 (measure)."""
        measured = measured or {}

        def stage(name: str) -> int:
            return min(s.max_batch_size, getattr(s, f"{name}_max_batch") or measured.get(name, s.max_batch_size))

        return cls(s.max_batch_size, s.max_queue_delay_ms, s.max_queue_size, int(s.stream_max_kv_mib * MIB),
                   s.http_reserved_share, s.stream_reserved_share, stage("flow"), stage("vocoder"))

    @property
    def capacity(self) -> int:
        """Requests in flight at once: a full running batch plus the waiting queue."""
        return self.max_batch_size + self.max_queue_size

    def share(self, session: bool) -> int:
        """Slots one kind may hold: the capacity less what is kept for the other kind (rounded down, so a
        small server keeps nothing rather than refusing a kind outright)."""
        kept = self.http_reserved_share if session else self.stream_reserved_share
        return self.capacity - int(self.capacity * kept)


def refusal(cfg: SchedulerConfig, session: bool, sessions: int, requests: int) -> str | None:
    """Why one more session (or HTTP request) cannot be admitted beside `sessions` and `requests` in
    flight, as its error code; None when it can. An idle session holds its slot for as long as it is
    open, so sessions alone must not be able to fill the server (and, if configured, the other way round)."""
    if sessions + requests >= cfg.capacity:
        return "server_overloaded"
    if (sessions if session else requests) >= cfg.share(session):
        return "session_share_full" if session else "http_share_full"
    return None


@dataclass
class _FlowWork:
    chunk: FlowChunk | None  # None: a final chunk with no new tokens (only the vocoder's held-back tail is left)
    segment_final: bool  # the segment's last chunk (upstream's finalize)
    final: bool  # the request's last chunk
    usage: SegmentDone | None = None  # a bistream segment's last chunk: its usage, completed by the vocoder


@dataclass
class _VocoderWork:
    mel: np.ndarray  # [80, chunk frames]
    segment_final: bool
    final: bool
    usage: SegmentDone | None = None


class Scheduler:
    def __init__(self, pipeline: Pipeline, config: SchedulerConfig, metrics: Metrics) -> None:
        self.p = pipeline
        self.cfg = config
        self.m = metrics
        man = pipeline.manifest
        self.hop = man.hop_samples
        self.ratio = man.token_mel_ratio
        self.silent, self.max_silent_run = frozenset(man.llm.silent_tokens), man.llm.max_silent_run
        self.seams = seams_of(man.streaming.seams, man.streaming.mel_cache_frames, man.streaming.look_right_frames,
                              self.hop)
        self.lookahead = man.flow.pre_lookahead_tokens
        self._lock = threading.Condition()
        # Every live request by key, and the one queue the LLM's decisions need (arrivals, in order); which
        # requests run, are parked or drain is read from their phases.
        self.requests: dict[int, SynthesisRequest] = {}
        self.waiting: deque[SynthesisRequest] = deque()
        self._reserved = 0  # slots held for requests whose text is being normalised (admission())
        self._aborted: Done | None = None  # abort_all's end, also for requests submitted after it
        self._look_again = False  # a session's text arrived or parked: the LLM loop reads the parked sessions again
        self._park_order = itertools.count()
        self._kv_limit_positions = max(1, config.session_kv_limit_bytes // pipeline.llm.kv_bytes_per_position)
        self._flow_q = StageQueue()
        self._voc_q = StageQueue()
        self._stopping = False
        self._avg_duration = 1.0
        # Requests in the batch each stage is computing now: the ones a stage failure takes down.
        self._running: dict[str, list[SynthesisRequest]] = {"llm": [], "flow": [], "vocoder": []}
        self._threads = [
            threading.Thread(target=self._guard, args=(self._llm_loop, "llm"), name="stage-llm", daemon=True),
            threading.Thread(target=self._guard, args=(self._flow_loop, "flow"), name="stage-flow", daemon=True),
            threading.Thread(target=self._guard, args=(self._vocoder_loop, "vocoder"), name="stage-vocoder", daemon=True),
        ]
        metrics.max_batch.set(config.max_batch_size)
        for stage, size in (("llm", config.max_batch_size), ("flow", config.flow_max_batch),
                            ("vocoder", config.vocoder_max_batch)):
            metrics.stage_max_batch.labels(stage).set(size)
        metrics.capacity.set(config.capacity)

    # Lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        # Four threads share the GIL (the event loop and three stages); the default 5 ms switch
        # interval would let one busy stage hold back the others' short steps.
        sys.setswitchinterval(0.001)
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._flow_q.close()
        self._voc_q.close()
        for t in self._threads:
            t.join(timeout=10)

    @property
    def inflight(self) -> int:
        return len(self.requests) + self._reserved

    @property
    def parked(self) -> list[SynthesisRequest]:
        """Parked sessions, in the order they left the batch."""
        with self._lock:
            return sorted((r for r in self.requests.values() if r.phase is PARKED), key=lambda r: r.parked_at)

    # Admission (event loop) -------------------------------------------------------------------
    def retry_after(self) -> int:
        waves = len(self.waiting) / max(1, self.cfg.max_batch_size) + 1
        return int(min(60, max(1, math.ceil(self._avg_duration * waves))))

    def _admit_locked(self, session: bool) -> None:
        sessions = sum(r.text.streamed for r in self.requests.values())
        code = refusal(self.cfg, session, sessions, self.inflight - sessions)
        if code is not None:
            self.m.admission_refusals.labels("websocket" if session else "http", code).inc()
            raise Overloaded(self.retry_after(), self.cfg.capacity, code, share=self.cfg.share(session))

    @contextmanager
    def admission(self) -> Iterator[Callable[[SynthesisRequest], None]]:
        """A slot held from before a request's text is normalised until it is submitted, or given back when
        the block ends without submitting (a bad input, a hang-up). Raises Overloaded when none is free: a
        full server refuses at once, not after normalising text it will not synthesise (each refusal
        would also hold up the text of the requests it accepts)."""
        with self._lock:
            self._admit_locked(session=False)
            self._reserved += 1
            self.m.inflight.set(self.inflight)
        held = True

        def submit(req: SynthesisRequest) -> None:
            nonlocal held
            with self._lock:
                self._reserved -= 1
                held = False
                self._enqueue_locked(req)
            self._end_if_aborted(req)

        try:
            yield submit
        finally:
            if held:
                with self._lock:
                    self._reserved -= 1
                    self.m.inflight.set(self.inflight)
                    self._lock.notify_all()

    def submit(self, req: SynthesisRequest) -> None:
        with self._lock:
            self._admit_locked(session=req.text.streamed)
            self._enqueue_locked(req)
        self._end_if_aborted(req)

    def _end_if_aborted(self, req: SynthesisRequest) -> None:
        """A request submitted after abort_all (its text was being normalised then) ends as the others did."""
        if self._aborted is not None:
            self.finish(req, self._aborted.outcome, self._aborted.message)

    def _enqueue_locked(self, req: SynthesisRequest) -> None:
        self.requests[id(req)] = req
        req.ender = self.finish
        req.text.wake = self._wake
        if req.text.streamed:  # a session starts parked: it runs once its text arrives
            self._park_locked(req, self._session_sequence(req))
        else:
            self._queue_locked(req)
        self.m.inflight.set(self.inflight)
        self._lock.notify_all()

    def _queue_locked(self, req: SynthesisRequest, first: bool = False) -> None:
        """Into the LLM's waiting queue; `first`: a request's next segment goes first (finish started work)."""
        req.phase, req.queued_at = WAITING, time.monotonic()
        if first:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)
        self.m.queue_depth.labels("llm").set(len(self.waiting))

    def _wake(self) -> None:
        """A session's text arrived (the event loop)."""
        with self._lock:
            self._look_again = True
            self._lock.notify_all()

    def finish(self, req: SynthesisRequest, outcome: Outcome, message: str = "") -> None:
        """The one way a request ends, whatever the reason (its audio is out, its handler cancelled it, a
        deadline, a bound, a stage failure, the drain): its slot is freed and the stages drop what is left of
        its work, then its handler hears Done. A request that has ended stays as it ended. Never called
        under the lock (it wakes the stage queues, whose takers read the scheduler under their own lock)."""
        with self._lock:
            if not req.alive:
                return
            was = req.phase
            req.phase, req.outcome = RequestPhase.FINISHED, outcome
            req.seq = req.block = None  # a parked cache goes now
            flow_cache, req.flow_cache = req.flow_cache, None
            del self.requests[id(req)]
            if outcome == Outcome.OK:
                self._avg_duration = 0.8 * self._avg_duration + 0.2 * (time.monotonic() - req.created)
            if was is WAITING:
                self.waiting.remove(req)
                self.m.queue_depth.labels("llm").set(len(self.waiting))
            elif was is PARKED:
                self._parked_metrics()
            self.m.inflight.set(self.inflight)
            self._lock.notify_all()
        if flow_cache is not None:
            flow_cache.release()
        self._flow_q.poke()
        self._voc_q.poke()
        req.push_done(Done(outcome, message))

    def idle(self) -> bool:
        return not self.requests and not self._reserved

    def abort_all(self, outcome: Outcome, message: str) -> int:
        """Ends every request in flight with `outcome` (the drain deadline passed), and each one whose text is
        still being normalised as soon as it is submitted; returns how many."""
        with self._lock:
            self._aborted = Done(outcome, message)
            victims = list(self.requests.values())
            pending = self._reserved
        for req in victims:
            self.finish(req, outcome, message)
        return len(victims) + pending

    @property
    def normalising(self) -> int:
        """Requests holding a slot while their text is normalised."""
        return self._reserved

    # Workers ----------------------------------------------------------------------------------
    def _guard(self, loop: Callable[[], None], stage: str) -> None:
        while True:
            try:
                loop()
                return
            except Exception:  # a bug or a device error must not kill the stage for everyone
                self._fail(self._running[stage], stage)
                self._running[stage] = []

    def _fail(self, batch: list[SynthesisRequest], stage: str) -> None:
        """Fails the requests of the batch a stage could not compute; everything else goes on."""
        victims = [r for r in batch if r.alive]
        log.exception("stage %s failed; failing the %d request(s) in its batch", stage, len(victims))
        for req in victims:
            self.finish(req, Outcome.FAILED, f"internal error in the {stage} stage")

    def _sequence(self, req: SynthesisRequest) -> Sequence:
        v = req.voice
        seq = self.p.llm.sequence(req.text.segments[req.segment], v.prompt_text_tokens, v.llm_prompt_speech_tokens,
                                  req.rng, req)
        # the request's output bound, and what the flow can take after the voice's prompt
        room = self.p.token_room(len(v.prompt_speech_tokens))
        seq.max_len = max(1, min(seq.max_len, req.max_tokens - len(req.tokens), room))
        return seq

    # Bistream sessions (under self._lock unless said otherwise) -------------------------------
    def _session_sequence(self, req: SynthesisRequest) -> Sequence:
        v = req.voice
        return self.p.llm.bistream_sequence(v.prompt_text_tokens, v.llm_prompt_speech_tokens, req.rng, req)

    def _parked_metrics(self) -> None:
        parked = [r.seq for r in self.requests.values() if r.phase is PARKED]
        self.m.parked_sessions.set(len(parked))
        self.m.parked_kv_bytes.set(sum(len(q.kv_mask) for q in parked if q.kv_mask is not None)
                                   * self.p.llm.kv_bytes_per_position)

    def _park_locked(self, req: SynthesisRequest, q: Sequence) -> None:
        """Out of the batch until its text arrives; nothing more comes from it until then."""
        req.phase, req.seq, req.parked_at = PARKED, q, next(self._park_order)
        self._look_again = True  # its text may already be there
        self._parked_metrics()

    def _limit_message(self) -> str:
        mib = self.cfg.session_kv_limit_bytes / (1 << 20)
        return (f"the text since the last flush needs more than this session's KV cache bound ({mib:g} MiB, "
                f"{self._kv_limit_positions} positions); flush at the ends of sentences")

    @staticmethod
    def _timeout_message(req: SynthesisRequest) -> str:
        return f"the audio for the text sent did not finish within the request timeout of {req.text.timeout_s:g} s"

    def _parked_views(self) -> list[ParkedView]:
        """The parked sessions for the plan, each with its text taken in and its next input block made
        when it has one (kept on the request until it joins: the block depends on the text only)."""
        views = []
        for req in self.parked:
            q = req.seq
            seg = req.text.segment(req.segment)
            if seg is not None and req.block is None:
                tokens, closed = seg
                q.bistream.add_text(tokens[q.bistream.text_tokens :])
                req.block = q.bistream.next_block(closed)
            views.append(ParkedView(id(req), seg is None, None if req.block is None else len(req.block), q.pos))
        return views

    def _apply_admission(self, plan: Admission) -> tuple[list[Sequence], list[SynthesisRequest], list[SynthesisRequest]]:
        """Moves the planned requests' phases (under the lock); returns the sequences that join the batch
        (sessions first, as the plan has them), the sessions that drain and those over their KV bound, for
        the caller to hand on once the lock is released."""
        llm = self.p.llm
        drained = [self.requests[key] for key in plan.drain]
        for req in drained:  # only the held-back tail is left: a final chunk with no new tokens
            req.phase, req.seq, req.flow_chunks = DRAINING, None, req.flow_chunks + 1
        joining = []
        for key in plan.resume:
            req = self.requests[key]
            q = req.seq
            q.prompt = llm.embed(req.block)
            if q.bistream.phase == InputPhase.FINAL:  # bounded as the whole-text decode: by its text and the flow
                room = self.p.token_room(len(req.voice.prompt_speech_tokens))
                q.max_len = max(len(q.tokens) + 1,
                                min(int(q.bistream.text_tokens * llm.spec.max_token_text_ratio), req.max_tokens, room))
            req.phase, req.seq, req.block = RUNNING, None, None
            joining.append(q)
        now = time.monotonic()
        for _ in range(plan.arrivals):
            req = self.waiting.popleft()
            req.phase = RUNNING
            self.m.queue_wait.labels("llm").observe(now - req.queued_at)
            joining.append(self._sequence(req))
        self.m.queue_depth.labels("llm").set(len(self.waiting))
        if plan.drain or plan.resume:
            self._parked_metrics()
        return joining, drained, [self.requests[key] for key in plan.over]

    def _llm_loop(self) -> None:
        llm = self.p.llm
        batch: Batch | None = None  # a restart after a failure starts empty: its requests were failed
        while True:
            with self._lock:
                while batch is None and not self.waiting and not self._look_again and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                plan = admit(len(batch.seqs) if batch else 0, self.cfg.max_batch_size, self._parked_views(),
                             len(self.waiting), self._kv_limit_positions)
                self._look_again = plan.look_again  # look again once the batch has room
                joining, drained, over = self._apply_admission(plan)
            for req in drained:
                self._flow_q.put(WorkItem(req, _FlowWork(None, True, True), req.due))
            for req in over:
                self.finish(req, Outcome.LIMIT, self._limit_message())
            if not joining and batch is None:
                continue  # no session had enough text
            t0 = time.perf_counter()
            self._running["llm"] = ([q.owner for q in batch.seqs] if batch else []) + [q.owner for q in joining]
            fresh = [q for q in joining if q.kv is None]  # arrivals, and sessions' first blocks of a segment
            resumed = [q for q in joining if q.kv is not None]
            new = []
            if joining:  # prefilled beside the running batch's step: sessions rejoin often, steps go on
                try:
                    new = [llm.prefill(fresh)] if fresh else []
                    new += [llm.resume(resumed)] if resumed else []
                except Exception:  # only the arrivals fail: the running batch's cache is untouched
                    self._fail([q.owner for q in joining], "llm")
                    new = []
            if batch is not None:
                self.m.batch_size.labels("llm").observe(len(batch.seqs))
                llm.step(batch)
                self._after_tokens(batch.seqs)
            for part in new:
                self._after_tokens(part.seqs)
                batch = llm.merge(batch, part)
            self.m.stage_compute.labels("llm").observe(time.perf_counter() - t0)
            batch = self._settle(batch) if batch is not None else None
            self._running["llm"] = []

    def _settle(self, batch: Batch) -> Batch | None:
        """After a step: parks the segments that asked for text, ends sessions past their deadline or KV
        bound, and drops every row that is done, cancelled or expired."""
        now = time.monotonic()
        seqs = batch.seqs
        plan = settle([RowView(q.done, q.owner.alive, q.owner.expired(now), q.owner.text.streamed, q.pos, q.waiting)
                       for q in seqs], self._kv_limit_positions)
        for i in plan.timeout:
            self.finish(seqs[i].owner, Outcome.TIMEOUT, self._timeout_message(seqs[i].owner))
        for i in plan.limit:
            self.finish(seqs[i].owner, Outcome.LIMIT, self._limit_message())
        if plan.park:
            self.p.llm.park(batch, list(plan.park))
        with self._lock:
            for i in plan.expired:  # its handler answers on its own clock and cancels it
                if seqs[i].owner.alive:
                    seqs[i].owner.phase = DRAINING
            for i in plan.park:
                if seqs[i].owner.alive:  # ended meanwhile: its copied cache is simply dropped
                    self._park_locked(seqs[i].owner, seqs[i])
        return self.p.llm.keep(batch, list(plan.keep))

    def _after_tokens(self, seqs: list[Sequence]) -> None:
        for q in seqs:
            req: SynthesisRequest = q.owner
            if not req.alive:
                continue
            fresh = q.tokens[req.llm_taken :]
            req.llm_taken = len(q.tokens)
            self.m.tokens.inc(len(fresh))
            kept, req.silent_run = drop_silence(fresh, req.silent_run, self.silent, self.max_silent_run)
            req.tokens.extend(kept)
            segment = req.tokens[req.segment_offset :]
            last_segment = req.text.last_segment(req.segment, q.done, len(req.tokens), req.max_tokens)
            while (span := req.planner.next(len(segment), q.done)) is not None:
                self._emit_flow(req, segment, span, span.final and last_segment,
                                self._usage(req, q) if span.final and req.text.streamed else None)
            if not q.done or not req.alive:  # alive: _emit_flow may have ended it
                continue
            if not last_segment:
                req.segment += 1
                req.segment_offset, req.llm_taken, req.silent_run = len(req.tokens), 0, 0
                req.planner.new_segment(restart_hop=req.text.streamed)
            with self._lock:
                if not req.alive:
                    continue
                if last_segment:
                    req.phase = DRAINING
                elif req.text.streamed:
                    self._park_locked(req, self._session_sequence(req))
                else:
                    self._queue_locked(req, first=True)
            if last_segment:
                self._flow_q.poke()

    def _usage(self, req: SynthesisRequest, q: Sequence) -> SegmentDone:
        seg = req.text.info(req.segment)
        return SegmentDone(segment=req.segment, text_tokens=q.bistream.text_tokens, speech_tokens=len(q.tokens),
                           audio_seconds=0.0, text_at=seg.text_at or 0.0, first_audio_at=None,
                           closed_at=seg.closed_at or time.monotonic(), done_at=0.0, auto=seg.auto)

    def _emit_flow(self, req: SynthesisRequest, segment: list[int], span: Span, final: bool,
                   usage: SegmentDone | None = None) -> None:
        """One upstream `token2wav` call: the flow over the prompt and all of the segment's tokens so far."""
        if span.offset == 0 and not span.final:
            req.flow_cache = self.p.flow.new_cache()
        cache = req.flow_cache
        if span.final:
            req.flow_cache = None  # the final chunk's run releases it: earlier chunks may still be queued
        if span.final and span.end == span.offset:
            if cache is not None:
                cache.release()
            self._queue_flow(req, _FlowWork(None, True, final, usage))
            return
        v = req.voice
        context = 0 if span.final else self.lookahead
        ahead = segment[: span.end + context]
        room = self.p.token_room(len(v.prompt_speech_tokens))
        if len(ahead) > room:  # past the flow's noise it would fail the whole flow batch it joined: it ends alone
            if cache is not None:
                cache.release()
            self.finish(req, Outcome.FAILED, f"the segment needs {len(ahead)} speech tokens after the voice's "
                        f"{len(v.prompt_speech_tokens)} prompt tokens, and the model takes {max(room, 0)} (its flow's "
                        f"noise buffer is {self.p.flow.max_frames} mel frames" + (
                            f", its vocoder's {self.p.vocoder.max_frames}" if self.p.vocoder.max_frames else "") + ")")
            return
        tokens = np.concatenate([v.prompt_speech_tokens, np.asarray(ahead, np.int64)])
        chunk = FlowChunk(
            tokens=tokens,
            token_len=len(v.prompt_speech_tokens) + span.end,
            context_len=context,
            streaming=not span.final,
            prompt_frames=len(v.prompt_speech_tokens) * self.ratio,
            offset_frames=span.offset * self.ratio,
            embedding=v.embedding,
            prompt_mel=v.prompt_mel,
            cache=cache,
        )
        self._queue_flow(req, _FlowWork(chunk, span.final, final, usage))

    def _queue_flow(self, req: SynthesisRequest, work: _FlowWork) -> None:
        with self._lock:
            req.flow_chunks += 1
        self._flow_q.put(WorkItem(req, work, req.due))
        self.m.queue_depth.labels("flow").set(len(self._flow_q))

    def _flow_upstream(self) -> set[int]:
        with self._lock:
            return {key for key, r in self.requests.items() if r.phase in LLM_PHASES}

    def _vocoder_upstream(self) -> set[int]:
        with self._lock:
            return {key for key, r in self.requests.items() if r.phase in LLM_PHASES or r.flow_chunks > 0}

    def _live(self, items: list[WorkItem], stage: str) -> list[WorkItem]:
        now = time.monotonic()
        for i in items:
            req: SynthesisRequest = i.request
            if req.text.streamed and req.alive and req.expired(now):
                self.finish(req, Outcome.TIMEOUT, self._timeout_message(req))
        live = [i for i in items if i.request.alive and not i.request.expired(now)]
        for i in live:
            self.m.queue_wait.labels(stage).observe(now - i.enqueued)
        return live

    def _flow_loop(self) -> None:
        delay = self.cfg.max_queue_delay_ms / 1000
        while (items := self._flow_q.take_batch(self.cfg.flow_max_batch, delay, self._flow_upstream)) is not None:
            self.m.queue_depth.labels("flow").set(len(self._flow_q))
            live = self._live(items, "flow")
            for item in items:  # a dropped segment-final chunk holds the only reference to its segment's cache
                if item not in live and item.payload.chunk is not None and item.payload.chunk.cache is not None:
                    item.payload.chunk.cache.release()
            self._running["flow"] = [i.request for i in live]
            t0 = time.perf_counter()
            work = [i for i in live if i.payload.chunk is not None]
            if work:
                self.m.batch_size.labels("flow").observe(len(work))
            mels = iter(self.p.flow.run([i.payload.chunk for i in work]) if work else [])
            self.m.stage_compute.labels("flow").observe(time.perf_counter() - t0)
            for item in live:
                w: _FlowWork = item.payload
                mel = next(mels) if w.chunk is not None else np.zeros((self.p.manifest.flow.mel_bins, 0), np.float32)
                item.request.push_mel(mel.shape[1] * self.hop / self.p.sample_rate)
                self._voc_q.put(WorkItem(item.request, _VocoderWork(mel, w.segment_final, w.final, w.usage), item.due))
            with self._lock:
                for item in items:
                    item.request.flow_chunks -= 1
            self.m.queue_depth.labels("vocoder").set(len(self._voc_q))
            self._voc_q.poke()
            self._running["flow"] = []

    def _vocoder_input(self, req: SynthesisRequest, w: _VocoderWork) -> VocoderInput:
        """As upstream `token2wav`: the chunk's mel after what its seam needs of earlier chunks; `speed` (per
        segment) stretches whole segments only."""
        speed = req.speed_at(req.vocoded_segments)
        mel, cache_source = self.seams.mel(req.seam, w.mel, w.segment_final, speed)
        return VocoderInput(mel, self.p.vocoder.noise(mel.shape[1], req.vocoder_rng), cache_source)

    def _vocoder_loop(self) -> None:
        delay = self.cfg.max_queue_delay_ms / 1000
        sr = self.p.sample_rate
        while (items := self._voc_q.take_batch(self.cfg.vocoder_max_batch, delay, self._vocoder_upstream)) is not None:
            self.m.queue_depth.labels("vocoder").set(len(self._voc_q))
            live = self._live(items, "vocoder")
            self._running["vocoder"] = [i.request for i in live]
            t0 = time.perf_counter()
            inputs = [self._vocoder_input(i.request, i.payload) for i in live]
            # Nothing to vocode: a segment that produced no speech tokens, with no held-back tail.
            work = [j for j, inp in enumerate(inputs) if inp.mel.shape[1]]
            if work:
                self.m.batch_size.labels("vocoder").observe(len(work))
            outputs = dict(zip(work, self.p.vocoder.run([inputs[j] for j in work]) if work else []))
            self.m.stage_compute.labels("vocoder").observe(time.perf_counter() - t0)
            for j, (item, inp) in enumerate(zip(live, inputs)):
                req: SynthesisRequest = item.request
                w: _VocoderWork = item.payload
                audio = np.zeros(0, np.float32)
                if j in outputs:
                    wav, source = outputs[j]
                    audio, req.seam = self.seams.audio(req.seam, wav, source, inp.mel, w.segment_final)
                if len(audio):
                    first = req.first_audio_at is None
                    req.push_audio(audio)
                    self.m.audio_seconds.inc(len(audio) / sr)
                    if first and not req.text.streamed:  # a session's first audio waits for its client's text
                        self.m.ttfa.observe(req.first_audio_at - req.created)
                    req.segment_samples += len(audio)
                    req.segment_first_audio_at = req.segment_first_audio_at or time.monotonic()
                if w.segment_final:
                    if w.usage is None and req.segment_marks:
                        req.push_segment_done(SegmentEnd(req.vocoded_segments))
                    req.vocoded_segments += 1
                    if w.usage is not None:
                        w.usage.audio_seconds = req.segment_samples / sr
                        w.usage.first_audio_at = req.segment_first_audio_at
                        w.usage.done_at = time.monotonic()
                        req.push_segment_done(w.usage)
                    req.segment_samples, req.segment_first_audio_at = 0, None
                if w.final:
                    self.finish(req, Outcome.OK)
            self._running["vocoder"] = []
