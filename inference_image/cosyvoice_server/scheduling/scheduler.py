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

from ..engine.bistream import Phase
from ..engine.flow import FlowChunk, VocoderInput
from ..engine.llm import Batch, Sequence
from ..engine.pipeline import Pipeline
from ..metrics import Metrics
from ..streaming import Span, interpolate_mel, seam
from .batching import StageQueue, WorkItem
from .request import Done, Outcome, SegmentDone, SynthesisRequest

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = 16
    max_queue_delay_ms: float = 5.0
    max_queue_size: int = 64
    session_kv_limit_bytes: int = 64 << 20  # one bistream session's KV cache (its text since the last flush)
    http_reserved_share: float = 0.0  # of the capacity, what sessions may not take
    stream_reserved_share: float = 0.0  # of the capacity, what HTTP requests may not take

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
        self.mel_cache = man.streaming.mel_cache_frames
        self.window = np.hamming(2 * self.mel_cache * self.hop)  # upstream's speech_window
        self.lookahead = man.flow.pre_lookahead_tokens
        self._lock = threading.Condition()
        self._waiting: deque[SynthesisRequest] = deque()
        self._enqueued: dict[int, float] = {}
        self._active: dict[int, SynthesisRequest] = {}
        self._reserved = 0  # slots held for requests whose text is being normalised (admission())
        self._sessions = 0  # bistream sessions among the active requests
        self._aborted: Done | None = None  # abort_all's end, also for requests submitted after it
        self._in_llm: set[int] = set()
        self._in_flow: dict[int, int] = {}
        # Bistream sessions out of the batch, waiting for text, in the order they left it; each with the
        # sequence of its current segment (its KV cache on it, or none before the segment's first input).
        self._parked: dict[int, Sequence] = {}
        self._text_arrived = False
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
        return len(self._active) + self._reserved

    # Admission (event loop) -------------------------------------------------------------------
    def retry_after(self) -> int:
        waves = len(self._waiting) / max(1, self.cfg.max_batch_size) + 1
        return int(min(60, max(1, math.ceil(self._avg_duration * waves))))

    def _admit_locked(self, session: bool) -> None:
        code = refusal(self.cfg, session, self._sessions, len(self._active) + self._reserved - self._sessions)
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
            self._admit_locked(session=req.feed is not None)
            self._enqueue_locked(req)
        self._end_if_aborted(req)

    def _end_if_aborted(self, req: SynthesisRequest) -> None:
        """A request submitted after abort_all (its text was being normalised then) ends as the others did."""
        if self._aborted is not None:
            req.push_done(self._aborted)
            self.release(req, self._aborted.outcome)

    def _enqueue_locked(self, req: SynthesisRequest) -> None:
        self._active[id(req)] = req
        if req.feed is not None:  # a session starts parked: it runs once its text arrives
            self._sessions += 1
            req.feed.wake = self._wake
            self._park_locked(self._session_sequence(req))
            self._text_arrived = True
        else:
            self._in_llm.add(id(req))
            self._enqueued[id(req)] = time.monotonic()
            self._waiting.append(req)
        self.m.inflight.set(self.inflight)
        self.m.queue_depth.labels("llm").set(len(self._waiting))
        self._lock.notify_all()

    def _wake(self) -> None:
        """A session's text arrived (the event loop)."""
        with self._lock:
            self._text_arrived = True
            self._lock.notify_all()

    def release(self, req: SynthesisRequest, outcome: Outcome) -> None:
        """Frees the request's slot now; its remaining work is dropped by the stages."""
        if req.finished is None:
            req.finished = outcome
        with self._lock:
            if self._active.pop(id(req), None) is not None:
                if req.feed is not None:
                    self._sessions -= 1
                if outcome == Outcome.OK:
                    self._avg_duration = 0.8 * self._avg_duration + 0.2 * (time.monotonic() - req.created)
            if self._enqueued.pop(id(req), None) is not None:  # still waiting for the LLM: leave the queue
                self._waiting.remove(req)
                self.m.queue_depth.labels("llm").set(len(self._waiting))
            self._in_llm.discard(id(req))
            self._in_flow.pop(id(req), None)
            if self._parked.pop(id(req), None) is not None:  # its parked KV cache goes now
                self._parked_metrics()
            self.m.inflight.set(self.inflight)
            self._lock.notify_all()
        self._flow_q.poke()
        self._voc_q.poke()

    def idle(self) -> bool:
        return not self._active and not self._reserved

    def abort_all(self, outcome: Outcome, message: str) -> int:
        """Ends every request in flight with `outcome` (the drain deadline passed), and each one whose text is
        still being normalised as soon as it is submitted; returns how many."""
        with self._lock:
            self._aborted = Done(outcome, message)
            victims = list(self._active.values())
            pending = self._reserved
        for req in victims:
            req.push_done(Done(outcome, message))
            self.release(req, outcome)
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
            req.push_done(Done(Outcome.FAILED, f"internal error in the {stage} stage"))
            self.release(req, Outcome.FAILED)

    def _sequence(self, req: SynthesisRequest) -> Sequence:
        v = req.voice
        seq = self.p.llm.sequence(req.segments[req.segment], v.prompt_text_tokens, v.llm_prompt_speech_tokens, req.rng, req)
        # the request's output bound, and what the flow can take after the voice's prompt
        room = self.p.flow.token_room(len(v.prompt_speech_tokens))
        seq.max_len = max(1, min(seq.max_len, req.max_tokens - len(req.tokens), room))
        return seq

    # Bistream sessions (under self._lock unless said otherwise) -------------------------------
    def _session_sequence(self, req: SynthesisRequest) -> Sequence:
        v = req.voice
        return self.p.llm.bistream_sequence(v.prompt_text_tokens, v.llm_prompt_speech_tokens, req.rng, req)

    def _parked_metrics(self) -> None:
        self.m.parked_sessions.set(len(self._parked))
        self.m.parked_kv_bytes.set(sum(len(q.kv_mask) for q in self._parked.values() if q.kv_mask is not None)
                                   * self.p.llm.kv_bytes_per_position)

    def _park_locked(self, q: Sequence) -> None:
        self._parked[id(q.owner)] = q
        self._in_llm.discard(id(q.owner))  # nothing more comes from it until the client sends text
        self._parked_metrics()

    def _limit_message(self) -> str:
        mib = self.cfg.session_kv_limit_bytes / (1 << 20)
        return (f"the text since the last flush needs more than this session's KV cache bound ({mib:g} MiB, "
                f"{self._kv_limit_positions} positions); flush at the ends of sentences")

    def _end_session(self, req: SynthesisRequest, outcome: Outcome, message: str) -> None:
        """A request the scheduler itself ends (its handler only waits for Done)."""
        if req.alive:
            self.release(req, outcome)  # freed before its handler hears of it
            req.push_done(Done(outcome, message))

    def _take_ready_sessions(self, room: int) -> tuple[list[Sequence], list[SynthesisRequest]]:
        """Parked sessions whose next input block is ready (up to `room`; the next block set as each
        sequence's `prompt`), and sessions over their KV bound. Sessions whose input ended between
        segments are finished here."""
        ready, over = [], []
        llm = self.p.llm
        for key, q in list(self._parked.items()):
            req: SynthesisRequest = q.owner
            b = q.bistream
            seg = req.feed.segment(req.segment)
            if seg is None:  # no text after the last flush and the input has ended: the session is done
                del self._parked[key]
                req.llm_done = True
                self._queue_flow(req, _FlowWork(None, True, True))
                continue
            tokens, closed = seg
            b.add_text(tokens[b.text_tokens :])
            if len(ready) >= room:
                self._text_arrived = True  # look again once the batch has room
                continue
            block = b.next_block(closed)
            if block is None:
                continue
            del self._parked[key]
            if q.pos + len(block) > self._kv_limit_positions:
                over.append(req)
                continue
            q.prompt = llm.embed(block)
            if b.phase == Phase.FINAL:  # as the whole-text path bounds its decode: by the segment's text and the flow
                room = self.p.flow.token_room(len(req.voice.prompt_speech_tokens))
                q.max_len = max(len(q.tokens) + 1,
                                min(int(b.text_tokens * llm.spec.max_token_text_ratio), req.max_tokens, room))
            self._in_llm.add(key)
            ready.append(q)
        self._parked_metrics()
        return ready, over

    def _llm_loop(self) -> None:
        llm = self.p.llm
        batch: Batch | None = None  # a restart after a failure starts empty: its requests were failed
        while True:
            with self._lock:
                while batch is None and not self._waiting and not self._text_arrived and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                self._text_arrived = False
                room = self.cfg.max_batch_size - (len(batch.seqs) if batch else 0)
                sessions, over = self._take_ready_sessions(room)  # started work goes first
                arrivals = []
                while self._waiting and len(arrivals) + len(sessions) < room:
                    req = self._waiting.popleft()
                    waited = time.monotonic() - self._enqueued.pop(id(req), time.monotonic())
                    if req.alive:
                        arrivals.append(req)
                        self.m.queue_wait.labels("llm").observe(waited)
                self.m.queue_depth.labels("llm").set(len(self._waiting))
            for req in over:
                self._end_session(req, Outcome.LIMIT, self._limit_message())
            fresh = [self._sequence(r) for r in arrivals] + [q for q in sessions if q.kv is None]
            resumed = [q for q in sessions if q.kv is not None]
            if not fresh and not resumed and batch is None:
                continue  # every arrival had hung up while it waited, or no session had enough text
            t0 = time.perf_counter()
            joining = [q.owner for q in fresh + resumed]
            self._running["llm"] = ([q.owner for q in batch.seqs] if batch else []) + joining
            new = []
            if joining:  # prefilled beside the running batch's step: sessions rejoin often, steps go on
                try:
                    new = [llm.prefill(fresh)] if fresh else []
                    new += [llm.resume(resumed)] if resumed else []
                except Exception:  # only the arrivals fail: the running batch's cache is untouched
                    self._fail(joining, "llm")
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
        llm = self.p.llm
        now = time.monotonic()
        keep, park = [], []
        for i, q in enumerate(batch.seqs):
            req: SynthesisRequest = q.owner
            if q.done or not req.alive:
                continue
            if req.expired(now):
                if req.feed is not None:
                    self._end_session(req, Outcome.TIMEOUT, "the audio for the text sent did not finish within "
                                      f"the request timeout of {req.feed.timeout_s:g} s")
                continue
            if q.bistream is not None and q.pos > self._kv_limit_positions:
                self._end_session(req, Outcome.LIMIT, self._limit_message())
                continue
            (park if q.waiting else keep).append(i)
        if park:
            llm.park(batch, park)
            with self._lock:
                for i in park:
                    q = batch.seqs[i]
                    if q.owner.alive:  # released meanwhile: its copied cache is simply dropped
                        self._park_locked(q)
                self._text_arrived = True  # its text may already be there
        return llm.keep(batch, keep)

    def _after_tokens(self, seqs: list[Sequence]) -> None:
        for q in seqs:
            req: SynthesisRequest = q.owner
            if not req.alive:
                continue
            fresh = q.tokens[len(req.tokens) - req.segment_offset :]
            req.tokens.extend(fresh)
            self.m.tokens.inc(len(fresh))
            segment = req.tokens[req.segment_offset :]
            if req.feed is not None:
                # a session's last segment: the input has ended and nothing came after this one
                last_segment = q.done and req.feed.ended and req.feed.segment(req.segment + 1) is None
            else:  # the last segment, or the request's output bound reached: no further segments
                last_segment = req.segment + 1 >= len(req.segments) or len(req.tokens) >= req.max_tokens
            while (span := req.planner.next(len(segment), q.done)) is not None:
                self._emit_flow(req, segment, span, span.final and last_segment,
                                self._usage(req, q) if span.final and req.feed is not None else None)
            if not q.done or not req.alive:  # alive: _emit_flow may have ended it
                continue
            if not last_segment:
                req.segment += 1
                req.segment_offset = len(req.tokens)
                req.planner.new_segment(restart_hop=req.feed is not None)
                with self._lock:
                    if req.feed is not None:
                        self._park_locked(self._session_sequence(req))
                        self._text_arrived = True
                    else:
                        self._enqueued[id(req)] = time.monotonic()
                        self._waiting.appendleft(req)  # next segment goes first: finish started work
            else:
                req.llm_done = True
                with self._lock:
                    self._in_llm.discard(id(req))
                self._flow_q.poke()

    def _usage(self, req: SynthesisRequest, q: Sequence) -> SegmentDone:
        seg = req.feed.info(req.segment)
        return SegmentDone(segment=req.segment, text_tokens=q.bistream.text_tokens, speech_tokens=len(q.tokens),
                           audio_seconds=0.0, text_at=seg.text_at or 0.0, first_audio_at=None,
                           closed_at=seg.closed_at or time.monotonic(), done_at=0.0, auto=seg.auto)

    def _emit_flow(self, req: SynthesisRequest, segment: list[int], span: Span, final: bool,
                   usage: SegmentDone | None = None) -> None:
        """One upstream `token2wav` call: the flow over the prompt and all of the segment's tokens so far."""
        if span.final and span.end == span.offset:
            self._queue_flow(req, _FlowWork(None, True, final, usage))
            return
        v = req.voice
        context = 0 if span.final else self.lookahead
        ahead = segment[: span.end + context]
        room = self.p.flow.token_room(len(v.prompt_speech_tokens))
        if len(ahead) > room:  # past the flow's noise it would fail the whole flow batch it joined: it ends alone
            self._end_session(req, Outcome.FAILED, f"the segment needs {len(ahead)} speech tokens after the voice's "
                              f"{len(v.prompt_speech_tokens)} prompt tokens, and the model's flow takes "
                              f"{max(room, 0)} (its noise buffer is {self.p.flow.max_frames} mel frames)")
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
        )
        self._queue_flow(req, _FlowWork(chunk, span.final, final, usage))

    def _queue_flow(self, req: SynthesisRequest, work: _FlowWork) -> None:
        with self._lock:
            self._in_flow[id(req)] = self._in_flow.get(id(req), 0) + 1
        self._flow_q.put(WorkItem(req, work))
        self.m.queue_depth.labels("flow").set(len(self._flow_q))

    def _flow_upstream(self) -> set[int]:
        with self._lock:
            return set(self._in_llm)

    def _vocoder_upstream(self) -> set[int]:
        with self._lock:
            return self._in_llm | set(self._in_flow)

    def _live(self, items: list[WorkItem], stage: str) -> list[WorkItem]:
        now = time.monotonic()
        for i in items:
            req: SynthesisRequest = i.request
            if req.feed is not None and req.alive and req.expired(now):
                self._end_session(req, Outcome.TIMEOUT, "the audio for the text sent did not finish within the "
                                  f"request timeout of {req.feed.timeout_s:g} s")
        live = [i for i in items if i.request.alive and not i.request.expired(now)]
        for i in live:
            self.m.queue_wait.labels(stage).observe(now - i.enqueued)
        return live

    def _flow_loop(self) -> None:
        delay = self.cfg.max_queue_delay_ms / 1000
        while (items := self._flow_q.take_batch(self.cfg.max_batch_size, delay, self._flow_upstream)) is not None:
            self.m.queue_depth.labels("flow").set(len(self._flow_q))
            live = self._live(items, "flow")
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
                self._voc_q.put(WorkItem(item.request, _VocoderWork(mel, w.segment_final, w.final, w.usage)))
            with self._lock:
                for item in items:
                    key = id(item.request)
                    if key in self._in_flow:
                        self._in_flow[key] -= 1
                        if self._in_flow[key] <= 0:
                            del self._in_flow[key]
            self.m.queue_depth.labels("vocoder").set(len(self._voc_q))
            self._voc_q.poke()
            self._running["flow"] = []

    def _vocoder_input(self, req: SynthesisRequest, w: _VocoderWork) -> VocoderInput:
        """As upstream `token2wav`: the cached mel frames go first; `speed` stretches whole segments only."""
        cache = req.hift_cache
        mel, cache_source = w.mel, np.zeros(0, np.float32)
        if cache is not None:
            mel, cache_source = np.concatenate([cache.mel, mel], axis=1), cache.source
        elif w.segment_final and req.speed != 1.0:
            mel = interpolate_mel(mel, req.speed)
        noise = req.vocoder_rng.standard_normal((mel.shape[1] * self.hop, self.p.vocoder.harmonics), np.float32)
        return VocoderInput(mel, noise, cache_source)

    def _vocoder_loop(self) -> None:
        delay = self.cfg.max_queue_delay_ms / 1000
        sr = self.p.sample_rate
        while (items := self._voc_q.take_batch(self.cfg.max_batch_size, delay, self._vocoder_upstream)) is not None:
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
                    audio, req.hift_cache = seam(wav, source, inp.mel, req.hift_cache, w.segment_final, self.mel_cache,
                                                 self.hop, self.window)
                if len(audio):
                    first = req.first_audio_at is None
                    req.push_audio(audio)
                    self.m.audio_seconds.inc(len(audio) / sr)
                    if first and req.feed is None:  # a session's first audio waits for its client's text
                        self.m.ttfa.observe(req.first_audio_at - req.created)
                    req.segment_samples += len(audio)
                    req.segment_first_audio_at = req.segment_first_audio_at or time.monotonic()
                if w.segment_final:
                    if w.usage is not None:
                        w.usage.audio_seconds = req.segment_samples / sr
                        w.usage.first_audio_at = req.segment_first_audio_at
                        w.usage.done_at = time.monotonic()
                        req.push_segment_done(w.usage)
                    req.segment_samples, req.segment_first_audio_at = 0, None
                if w.final:
                    req.push_done(Done(Outcome.OK))
                    self.release(req, Outcome.OK)
            self._running["vocoder"] = []
