"""Load generation against the peer servers, in loadgen's style and with its Result.

Neither peer streams, so time to first audio is the whole latency. Responses are not decoded beyond what
gives the audio length (LitServe: the base64 length; Triton: the JSON header before the binary tensor),
so the client costs about what it costs against our server.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable

import httpx
import numpy as np

from ..loadgen import Result, clients, drive

SAMPLE_RATE = 24000
TRITON_MODEL = "tts"


def litserve_body(text: str, seed: int) -> dict:
    return {"input": text, "seed": seed}


def triton_body(text: str, seed: int) -> dict:
    """KServe v2 JSON request; the audio comes back as a binary tensor after the JSON header."""
    return {
        "inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]},
                   {"name": "seed", "shape": [1, 1], "datatype": "INT64", "data": [seed]}],
        "outputs": [{"name": "audio", "parameters": {"binary_data": True}},
                    {"name": "length", "parameters": {"binary_data": False}}],
    }


def _b64_len(s: str) -> int:
    return len(s) * 3 // 4 - s[-2:].count("=")


def _triton_header(r: httpx.Response) -> tuple[dict, int]:
    n = int(r.headers.get("inference-header-content-length", len(r.content)))
    return json.loads(r.content[:n]), n


def _triton_length(header: dict) -> int:
    out = {o["name"]: o for o in header["outputs"]}
    return int(out["length"]["data"][0])


async def fetch_audio(kind: str, client: httpx.AsyncClient, text: str, seed: int) -> np.ndarray:
    """A peer's whole response as int16 samples (raises on an error status)."""
    if kind == "litserve":
        r = await client.post("/predict", json=litserve_body(text, seed))
        r.raise_for_status()
        return np.frombuffer(base64.b64decode(r.json()["audio"]), np.int16)
    r = await client.post(f"/v2/models/{TRITON_MODEL}/infer", json=triton_body(text, seed))
    r.raise_for_status()
    header, n = _triton_header(r)  # the audio tensor follows the JSON header, padded to its batch's longest
    return np.frombuffer(r.content[n:], np.int16)[: _triton_length(header)]


async def one_litserve(client: httpx.AsyncClient, text: str, seed: int) -> Result:
    t0 = time.perf_counter()
    try:
        r = await client.post("/predict", json=litserve_body(text, seed))
    except httpx.TransportError:  # a peer that fell over is recorded (code 0), not raised into the harness
        return Result(0, time.perf_counter() - t0, None, 0.0, t0)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        return Result(r.status_code, dt, None, 0.0, t0)
    return Result(200, dt, dt, _b64_len(r.json()["audio"]) / 2 / SAMPLE_RATE, t0)


async def one_pytriton(client: httpx.AsyncClient, text: str, seed: int) -> Result:
    t0 = time.perf_counter()
    try:
        r = await client.post(f"/v2/models/{TRITON_MODEL}/infer", json=triton_body(text, seed))
    except httpx.TransportError:
        return Result(0, time.perf_counter() - t0, None, 0.0, t0)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        return Result(r.status_code, dt, None, 0.0, t0)
    return Result(200, dt, dt, _triton_length(_triton_header(r)[0]) / SAMPLE_RATE, t0)


ONE: dict[str, Callable[[httpx.AsyncClient, str, int], Awaitable[Result]]] = {
    "litserve": one_litserve, "pytriton": one_pytriton}


async def closed_loop_peer(kind: str, url: str, concurrency: int, duration: float, text: str,
                           warmup: float = 1.0) -> list[Result]:
    """The same closed loop and counting window as our server's (loadgen.drive)."""
    one = ONE[kind]
    pool = clients(url, min(8, concurrency))
    try:
        return await drive(lambda i, seed: one(pool[i % len(pool)], text, seed), concurrency, duration, warmup)
    finally:
        await asyncio.gather(*[c.aclose() for c in pool])
