"""Driving a bistream session from a test: feed text deltas, collect what its out queue delivers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import numpy as np

from cosyvoice_server.scheduling.request import Done, SegmentDone, SynthesisRequest
from cosyvoice_server.state import ServerState


class Session:
    """What a session's out queue delivered."""

    def __init__(self, req: SynthesisRequest) -> None:
        self.req = req
        self.chunks: list[np.ndarray] = []
        self.segments: list[SegmentDone] = []
        self.done: Done | None = None
        self.segment_audio: list[np.ndarray] = []  # the audio of each segment (before its SegmentDone)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    async def collect(self, timeout: float = 120) -> Session:
        pending: list[np.ndarray] = []
        while self.done is None:
            item = await asyncio.wait_for(self.req.out.get(), timeout)
            if isinstance(item, np.ndarray):
                self.chunks.append(item)
                pending.append(item)
            elif isinstance(item, SegmentDone):
                self.segments.append(item)
                self.segment_audio.append(np.concatenate(pending) if pending else np.zeros(0, np.float32))
                pending = []
            else:
                self.done = item
        return self


async def feed(req: SynthesisRequest, parts: Iterable[str | None], pause_s: float = 0.0, end: bool = True) -> None:
    """Pushes text deltas (None = flush), pausing between them so the LLM runs while text arrives."""
    for part in parts:
        if part is None:
            req.text.flush()
        else:
            req.text.push(part)
        await asyncio.sleep(pause_s)
    if end:
        req.text.end()


async def speak(state: ServerState, parts: Iterable[str | None], voice: str | None = None, seed: int = 0,
                pause_s: float = 0.0) -> Session:
    req = state.new_bistream_request(voice, seed=seed)
    state.scheduler.submit(req)
    session = Session(req)
    collecting = asyncio.create_task(session.collect())
    await feed(req, parts, pause_s)
    return await collecting
