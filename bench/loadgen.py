"""Load generation against the speech API: closed-loop concurrency and open-loop Poisson arrivals.

Requests are spread over several HTTP clients (one httpx client tops out near 600 requests/s on a
small machine). Each result records latency, time to first audio (streaming) and audio produced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import numpy as np

WAV_HEADER = 44


@dataclass
class Result:
    code: int
    latency: float
    ttfa: float | None
    audio_s: float
    start: float


def in_window(r: Result, start: float, stop: float) -> bool:
    """Counted requests finish within the measured window: throughput is completions per second of
    the window, the same definition for every system."""
    return start <= r.start + r.latency <= stop


def body(text: str, seed: int, stream: bool, fmt: str = "pcm", voice: str | None = None) -> dict:
    return {"model": "tts-1", "input": text, "response_format": fmt, "stream": stream, "seed": seed,
            **({"voice": voice} if voice else {})}


async def one(client: httpx.AsyncClient, text: str, seed: int, stream: bool, voice: str | None = None) -> Result:
    t0 = time.perf_counter()
    if not stream:
        r = await client.post("/v1/audio/speech", json=body(text, seed, False, voice=voice))
        dt = time.perf_counter() - t0
        ttfa = float(r.headers["x-time-to-first-audio-ms"]) / 1000 if r.status_code == 200 else None
        return Result(r.status_code, dt, ttfa, len(r.content) / 48000 if r.status_code == 200 else 0.0, t0)
    ttfa, n = None, 0
    async with client.stream("POST", "/v1/audio/speech", json=body(text, seed, True, voice=voice)) as r:
        async for part in r.aiter_raw():
            if ttfa is None and part:
                ttfa = time.perf_counter() - t0
            n += len(part)
    return Result(r.status_code, time.perf_counter() - t0, ttfa, n / 48000 if r.status_code == 200 else 0.0, t0)


def clients(url: str, n: int, timeout: float = 300) -> list[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    return [httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) for _ in range(n)]


async def drive(send: Callable[[int, int], Awaitable[Result]], concurrency: int, duration: float,
                warmup: float = 1.0) -> list[Result]:
    """The closed loop every system is measured with: `concurrency` users, each calling
    `send(user, seed)` again as soon as its last request returns; seeds are user * 100000 + k."""
    results: list[Result] = []
    t_start = time.perf_counter()
    stop = t_start + warmup + duration

    async def user(i: int) -> None:
        seed = i * 100_000
        while time.perf_counter() < stop:
            r = await send(i, seed)
            seed += 1
            if in_window(r, t_start + warmup, stop):
                results.append(r)

    await asyncio.gather(*[user(i) for i in range(concurrency)])
    return results


async def closed_loop(url: str, concurrency: int, duration: float, text: str, stream: bool, warmup: float = 1.0) -> list[Result]:
    pool = clients(url, min(8, concurrency))
    try:
        return await drive(lambda i, seed: one(pool[i % len(pool)], text, seed, stream), concurrency, duration, warmup)
    finally:
        await asyncio.gather(*[c.aclose() for c in pool])


async def open_loop(url: str, rate: float, duration: float, text: str, stream: bool, seed: int = 0) -> list[Result]:
    """Poisson arrivals at `rate` requests/s, whatever the server's state (a queueing test)."""
    pool = clients(url, 8)
    rng = np.random.default_rng(seed)
    tasks = []
    t, end = time.perf_counter(), time.perf_counter() + duration
    i = 0
    try:
        while t < end:
            t += rng.exponential(1 / rate)
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            tasks.append(asyncio.create_task(one(pool[i % len(pool)], text, i, stream)))
            i += 1
        return list(await asyncio.gather(*tasks))
    finally:
        await asyncio.gather(*[c.aclose() for c in pool])
