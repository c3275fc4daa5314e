"""One speech request as the scheduler sees it: its inputs, its lifecycle (`phase`, then `outcome`), its
per-request streaming state and the asyncio queue its handler reads audio from. Its text is a `TextSource`:
`WholeText` (all of it known at submission) or a `TextFeed` (a bistream session: its text arrives while it
runs)."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from ..engine.bistream import Item
from ..engine.flow import FlowCache
from ..engine.llm import Sequence
from ..engine.pipeline import Voice
from ..frontend import speakable
from ..streamtext import StreamTokenizer
from ..streaming import ChunkPlanner, SeamState

_ids = itertools.count(1)


class RequestPhase(str, Enum):
    """Where a request is in its life (as vLLM's RequestStatus); the scheduler alone moves it, under its lock."""

    WAITING = "waiting"  # queued for the LLM batch (a whole-text segment)
    RUNNING = "running"  # in the LLM batch
    PARKED = "parked"  # a session out of the batch, waiting for text, its KV cache on its sequence
    DRAINING = "draining"  # the LLM is done with it: its last chunks are in the flow or vocoder stage
    FINISHED = "finished"  # ended, with an `outcome`; its slot is free


class Outcome(str, Enum):
    OK = "ok"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    FAILED = "failed"
    SHUTDOWN = "shutdown"  # the drain deadline passed before it finished
    LIMIT = "limit"  # a bistream session's text since its last flush outgrew the session's KV cache bound


def request_rngs(seed: int | None) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for the LLM's sampling and the vocoder's source noise (two stage threads)."""
    llm, vocoder = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(llm), np.random.default_rng(vocoder)


@dataclass
class Done:
    outcome: Outcome
    message: str = ""


@dataclass
class SegmentDone:
    """After the last audio of a bistream segment (ended by a flush or the end of input): its usage."""

    segment: int  # 0, 1, ... in the session
    text_tokens: int
    speech_tokens: int
    audio_seconds: float
    text_at: float  # time.monotonic() of the segment's first text delta
    first_audio_at: float | None  # of its first audio sent (None: it produced none)
    closed_at: float  # of the flush / end of input that closed it (or of its last text, if `auto`)
    done_at: float
    auto: bool = False  # closed by the server (at a sentence end, or at the segment cap), not by a flush


@dataclass
class SegmentEnd:
    """After the last audio of a whole-text request's segment, for requests that asked (`segment_marks`)."""

    segment: int


class TextSource(ABC):
    """A request's text as the scheduler reads it, one segment at a time."""

    streamed: bool = False  # its text arrives while it runs: it waits for text out of the batch (parked)
    wake: Callable[[], None] = staticmethod(lambda: None)  # set by the scheduler: text arrived

    def expired(self, now: float, deadline: float) -> bool:
        return now >= deadline

    @abstractmethod
    def last_segment(self, segment: int, decoded: bool, tokens: int, max_tokens: int) -> bool:
        """Whether `segment`, once `decoded`, is the request's last, with `tokens` speech tokens produced
        so far of at most `max_tokens`."""


@dataclass
class WholeText(TextSource):
    """Text known whole at submission: its LLM segments' text tokens."""

    segments: list[np.ndarray]
    speeds: list[float] | None = None  # each segment's, where they differ (SSML prosody)

    def last_segment(self, segment: int, decoded: bool, tokens: int, max_tokens: int) -> bool:
        # the last segment, or the request's output bound reached: no further segments
        return segment + 1 >= len(self.segments) or tokens >= max_tokens

    @property
    def input_tokens(self) -> int:
        return sum(len(x) for x in self.segments)


class FeedClosed(ValueError):
    """Text or a flush after `end()`."""


@dataclass
class FeedSegment:
    tokens: list[int] = field(default_factory=list)
    chars: int = 0  # characters of its text as spoken (cleaned), set when it closes
    text_at: float | None = None
    closed_at: float | None = None
    auto: bool = False
    speakable: bool = False  # has a letter or digit; until then the LLM gets none of its tokens


class TextFeed(TextSource):
    """The text of a bistream session, as it arrives. Methods are called from the event loop; the LLM
    stage reads committed text tokens per segment. Every call moves the session's deadline: text must
    become audio within `timeout_s` of its arrival (a session waiting for text has no deadline; the
    connection's idle timeout ends silent clients).

    Text that goes on without a flush is cut into segments as the whole-text path cuts a paragraph: at
    the first sentence end once a segment has `segment_tokens` text tokens before it (decided on the committed
    tokens, so it does not depend on the split either). That keeps each segment within what the model
    was trained on, and a session's KV cache bounded. Text without a sentence end is cut at `max_tokens`,
    as the whole-text path cuts a sentence without punctuation: a segment's speech must fit the flow.
    A segment with nothing to say (punctuation, emoji) is dropped, as the whole-text path drops one."""

    streamed = True

    def __init__(self, tokenizer: StreamTokenizer, timeout_s: float, segment_tokens: int | None = None,
                 max_tokens: int | None = None) -> None:
        self._tok = tokenizer
        self._lock = threading.Lock()
        self._segments: list[FeedSegment] = [FeedSegment()]
        self._ended = False
        self.timeout_s = timeout_s
        self.segment_tokens = segment_tokens
        self.max_tokens = max_tokens
        self.deadline = math.inf
        self.first_text_at: float | None = None

    def _touch(self) -> float:
        now = time.monotonic()
        self.deadline = now + self.timeout_s
        return now

    def push(self, text: str) -> None:
        """A text delta (any split, even mid-word)."""
        with self._lock:
            if self._ended:
                raise FeedClosed("text after the end of input")
            now = self._touch()
            seg = self._segments[-1]
            if text and seg.text_at is None:
                seg.text_at = now
                self.first_text_at = self.first_text_at or now
            self._append(self._tok.push(text), now)
        self.wake()

    def _append(self, tokens: list[int], now: float) -> None:
        seg = self._segments[-1]
        for t in tokens:
            n = len(seg.tokens)
            if ((self.max_tokens and n >= self.max_tokens)
                    or (self.segment_tokens and n >= self.segment_tokens and self._tok.sentence_break(seg.tokens, t))):
                seg = self._end_segment(now, auto=True)
            seg.tokens.append(t)

    def _speakable(self, seg: FeedSegment) -> bool:
        if not seg.speakable:  # decoded whole: a byte-level token may hold part of a letter
            seg.speakable = speakable(self._tok.tok.decode(seg.tokens))
        return seg.speakable

    def _end_segment(self, now: float, auto: bool) -> FeedSegment:
        """Closes the current segment, or drops it if it has nothing to say; returns the next one."""
        seg = self._segments[-1]
        nxt = FeedSegment(text_at=now if auto else None)  # auto: the text goes on in the next one
        if self._speakable(seg):
            seg.closed_at, seg.auto, seg.chars = now, auto, len(self._tok.tok.decode(seg.tokens))
            self._segments.append(nxt)
        else:  # a flush with nothing buffered, or only punctuation: no segment
            self._segments[-1] = nxt
        return nxt

    def _close(self, now: float) -> None:
        self._append(self._tok.flush(), now)
        self._end_segment(now, auto=False)

    def flush(self) -> None:
        """End of a thought: what is buffered is spoken as at the end of input; later text starts a new segment."""
        with self._lock:
            if self._ended:
                raise FeedClosed("flush after the end of input")
            self._close(self._touch())
        self.wake()

    def end(self) -> None:
        """No more text: the session finishes after its last segment."""
        with self._lock:
            if self._ended:
                return
            self._close(self._touch())
            self._ended = True
        self.wake()

    # Called from the LLM stage ---------------------------------------------------------------
    def segment(self, i: int) -> tuple[list[int], bool] | None:
        """Segment i's committed text tokens so far and whether it is closed; None if it has not begun
        and never will (the input ended before it)."""
        with self._lock:
            if i >= len(self._segments) or (self._ended and i == len(self._segments) - 1):
                return None
            seg = self._segments[i]
            return list(seg.tokens) if self._speakable(seg) else [], seg.closed_at is not None

    def info(self, i: int) -> FeedSegment:
        with self._lock:
            return self._segments[i]

    @property
    def closed_segments(self) -> int:
        """Segments closed so far, by flushes, the end of input or at sentence ends."""
        with self._lock:
            return sum(seg.closed_at is not None for seg in self._segments)

    @property
    def ended(self) -> bool:
        return self._ended

    def expired(self, now: float, deadline: float) -> bool:
        """Past the feed's own deadline (text must become audio in time), not the request's."""
        return now >= self.deadline

    def last_segment(self, segment: int, decoded: bool, tokens: int, max_tokens: int) -> bool:
        # the input has ended and nothing came after this segment (`max_tokens` bounds each segment)
        return decoded and self.ended and self.segment(segment + 1) is None


def _unsubmitted(req: SynthesisRequest, outcome: Outcome, message: str) -> None:
    req.phase, req.outcome = RequestPhase.FINISHED, outcome


@dataclass(eq=False)
class SynthesisRequest:
    text: TextSource
    voice: Voice
    speed: float
    seed: int | None
    deadline: float  # time.monotonic() by which the last sample must be out
    loop: asyncio.AbstractEventLoop
    planner: ChunkPlanner
    max_tokens: int  # speech tokens this request may produce at most (its output bound; per segment for a session)
    id: int = field(default_factory=lambda: next(_ids))
    created: float = field(default_factory=time.monotonic)
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    rng: np.random.Generator = field(init=False)  # LLM sampling (the LLM stage's thread)
    vocoder_rng: np.random.Generator = field(init=False)  # the vocoder source's noise (the vocoder's thread)
    tokens: list[int] = field(default_factory=list)
    segment: int = 0
    segment_offset: int = 0  # len(tokens) when the current segment started
    llm_taken: int = 0  # the current segment's LLM tokens read so far (silent runs past the model's bound are not kept)
    silent_run: int = 0  # silent tokens in a row at the end of what was read
    seam: SeamState = None  # what the current streamed segment's next chunk joins (streaming.py)
    flow_cache: FlowCache | None = None  # the streamed segment's, from its first chunk to its last
    first_audio_at: float | None = None
    first_mel_at: float | None = None  # when the flow returned its first mel (the flow's thread)
    mel_seconds: float = 0.0  # audio the mel returned so far makes
    segment_samples: int = 0  # audio samples sent for the current segment (the vocoder's thread)
    segment_first_audio_at: float | None = None
    vocoded_segments: int = 0  # segments whose audio is all out (the vocoder's thread)
    segment_marks: bool = False  # a SegmentEnd after each whole-text segment's audio
    # The lifecycle, moved by the scheduler under its lock.
    phase: RequestPhase = RequestPhase.WAITING
    outcome: Outcome | None = None  # set when the phase becomes FINISHED
    queued_at: float = 0.0  # when it last joined the waiting queue
    parked_at: int = 0  # park order: sessions rejoin the batch in the order they left it
    seq: Sequence | None = None  # a parked session's sequence (its KV cache on it, none before its first input)
    block: list[Item] | None = None  # a parked session's next input block, ready for when the batch has room
    flow_chunks: int = 0  # its chunks queued for or in the flow stage
    ender: Callable[[SynthesisRequest, Outcome, str], None] = _unsubmitted  # the scheduler's finish(), once submitted

    def __post_init__(self) -> None:
        self.rng, self.vocoder_rng = request_rngs(self.seed)

    # Called from worker threads ------------------------------------------------------------
    def expired(self, now: float) -> bool:
        return self.text.expired(now, self.deadline)

    def push_audio(self, audio: np.ndarray) -> None:
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        self.loop.call_soon_threadsafe(self.out.put_nowait, audio)

    def push_mel(self, seconds: float) -> None:
        if self.first_mel_at is None:
            self.first_mel_at = time.monotonic()
        self.mel_seconds += seconds

    def due(self) -> float:
        """When its listener runs out of audio (monotonic s), playing from the flow's first mel on (the vocoder
        follows within a chunk's time): a request the flow has returned nothing for has been due since it
        arrived. Read when a batch is picked, so a request's later chunks, queued before its first was out,
        stop going before other requests' first chunks as soon as it is."""
        return self.created if self.first_mel_at is None else self.first_mel_at + self.mel_seconds

    def speed_at(self, segment: int) -> float:
        speeds = getattr(self.text, "speeds", None)
        return speeds[segment] if speeds else self.speed

    def push_segment_done(self, done: SegmentDone | SegmentEnd) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, done)

    def push_done(self, done: Done) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, done)

    # Called from the event loop --------------------------------------------------------------
    def cancel(self) -> None:
        """The client went away or the handler gave up: the request ends now (its slot is free at once) and
        the stages drop its remaining work. Nothing happens if it has ended already."""
        self.ender(self, Outcome.CANCELLED, "cancelled")

    @property
    def alive(self) -> bool:
        return self.phase is not RequestPhase.FINISHED
