"""One speech request as the scheduler sees it: its inputs, its per-request streaming state and the
asyncio queue its HTTP handler reads audio from."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from ..engine.pipeline import Voice
from ..streaming import ChunkPlanner, HiftCache

_ids = itertools.count(1)


class Outcome(str, Enum):
    OK = "ok"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    FAILED = "failed"
    SHUTDOWN = "shutdown"  # the drain deadline passed before it finished


def request_rngs(seed: int | None) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for the LLM's sampling and the vocoder's source noise (two stage threads)."""
    llm, vocoder = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(llm), np.random.default_rng(vocoder)


@dataclass
class Done:
    outcome: Outcome
    message: str = ""


@dataclass(eq=False)
class SynthesisRequest:
    segments: list[np.ndarray]
    voice: Voice
    speed: float
    seed: int | None
    deadline: float  # time.monotonic() by which the last sample must be out
    loop: asyncio.AbstractEventLoop
    planner: ChunkPlanner
    max_tokens: int  # speech tokens this request may produce at most (its output bound)
    id: int = field(default_factory=lambda: next(_ids))
    created: float = field(default_factory=time.monotonic)
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    rng: np.random.Generator = field(init=False)  # LLM sampling (the LLM stage's thread)
    vocoder_rng: np.random.Generator = field(init=False)  # the vocoder source's noise (the vocoder's thread)
    tokens: list[int] = field(default_factory=list)
    segment: int = 0
    segment_offset: int = 0  # len(tokens) when the current segment started
    llm_done: bool = False
    hift_cache: HiftCache | None = None
    first_audio_at: float | None = None
    samples: int = 0
    finished: Outcome | None = None

    def __post_init__(self) -> None:
        self.rng, self.vocoder_rng = request_rngs(self.seed)

    # Called from worker threads ------------------------------------------------------------
    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def push_audio(self, audio: np.ndarray) -> None:
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        self.samples += len(audio)
        self.loop.call_soon_threadsafe(self.out.put_nowait, audio)

    def push_done(self, done: Done) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, done)

    # Called from the event loop --------------------------------------------------------------
    def cancel(self) -> None:
        """The client went away or the handler gave up; workers drop this request at their next look."""
        if self.finished is None:
            self.finished = Outcome.CANCELLED

    @property
    def alive(self) -> bool:
        return self.finished is None
