"""The engine limit: the same pipeline and the same scheduler (LLM steps, flow/vocoder chunk
batches), driven in-process with no HTTP. What the server can at best approach on this machine."""

from __future__ import annotations

import time
from pathlib import Path

from cosyvoice_server.api.schemas import SpeechRequest
from cosyvoice_server.config import Settings
from cosyvoice_server.metrics import Metrics
from cosyvoice_server.scheduling.request import Done, Outcome
from cosyvoice_server.state import ServerState

from .loadgen import Result, drive


class Engine:
    def __init__(self, model_dir: Path, device: str, max_batch_size: int, precision: str = "auto") -> None:
        self.state = ServerState(Settings(model_dir=model_dir, device=device, max_batch_size=max_batch_size, precision=precision,
                                          max_queue_size=10_000, request_timeout_s=3600), Metrics())
        self.state.load()

    def close(self) -> None:
        self.state.scheduler.stop()

    async def one(self, text: str, seed: int) -> Result:
        t0 = time.perf_counter()
        req = self.state.new_request(SpeechRequest(model="tts-1", input=text, seed=seed))
        self.state.scheduler.submit(req)
        samples, ttfa = 0, None
        while not isinstance(item := await req.out.get(), Done):
            if ttfa is None:
                ttfa = time.perf_counter() - t0
            samples += len(item)
        ok = item.outcome == Outcome.OK
        return Result(200 if ok else 500, time.perf_counter() - t0, ttfa, samples / 24000, t0)

    async def closed_loop(self, concurrency: int, duration: float, text: str, warmup: float = 1.0) -> list[Result]:
        return await drive(lambda _, seed: self.one(text, seed), concurrency, duration, warmup)
