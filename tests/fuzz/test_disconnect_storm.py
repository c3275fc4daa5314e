"""A disconnect storm against a real server: many clients hang up at random points (queued, mid-
synthesis, mid-stream) while the others must get their full audio, and the server must stay sound."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import time

import httpx
import soundfile as sf

SENTENCES = ["A storm of clients comes and goes.", "Some of them hang up at once.",
             "Others wait for every sample.", "The server must not lose the rest."]
SAMPLES_PER_TOKEN = 960
N = 96  # clients per round
ROUNDS = 3


def _body(rng: random.Random, i: int, **kw) -> dict:
    text = " ".join(rng.sample(SENTENCES, rng.randint(1, 4)))
    return {"model": "tts-1", "input": text, "seed": i} | kw


async def _complete_wav(c: httpx.AsyncClient, body: dict) -> str | None:
    r = await c.post("/v1/audio/speech", json=body | {"response_format": "wav", "stream": False})
    if r.status_code != 200:
        return f"wav: HTTP {r.status_code} {r.text[:200]}"
    audio, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    if sr != 24000 or len(audio) != int(r.headers["x-speech-tokens"]) * SAMPLES_PER_TOKEN:
        return f"wav: {len(audio)} samples for {r.headers['x-speech-tokens']} tokens"
    return None


async def _complete_sse(c: httpx.AsyncClient, body: dict) -> str | None:
    pcm, done = b"", None
    async with c.stream("POST", "/v1/audio/speech", json=body | {"response_format": "pcm", "stream": True, "stream_format": "sse"}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "speech.audio.delta":
                    pcm += base64.b64decode(event["audio"])
                else:
                    done = event
    if done is None or done["type"] != "speech.audio.done":
        return f"sse: ended with {done}"
    if len(pcm) != done["usage"]["output_tokens"] * SAMPLES_PER_TOKEN * 2:
        return f"sse: {len(pcm)} bytes for {done['usage']['output_tokens']} tokens"
    return None


async def _hang_up(c: httpx.AsyncClient, body: dict, after_s: float, how: str) -> None:
    """how: "waiting" (a plain request given up after `after_s`), "streaming" (a stream dropped before its
    first byte, often while still queued for the LLM), "mid-stream" (dropped after its first audio)."""
    async def go():
        if how == "waiting":
            await c.post("/v1/audio/speech", json=body | {"response_format": "wav", "stream": False})
            return
        async with c.stream("POST", "/v1/audio/speech", json=body | {"response_format": "pcm", "stream": True}) as r:
            async for _ in r.aiter_raw():
                await asyncio.sleep(after_s)
                return

    try:
        await asyncio.wait_for(go(), timeout=after_s if how != "mid-stream" else after_s + 60)
    except (TimeoutError, httpx.HTTPError):
        pass


async def test_disconnect_storm_keeps_every_other_request_whole(start_server):
    s = start_server("--max-batch-size", "8", "--max-queue-size", "128")
    rng = random.Random(10)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)  # a hang-up closes its own socket
    kinds: list[str] = []
    problems: list[str] = []
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=s.url, timeout=180, limits=limits) as c:
        for _ in range(ROUNDS):
            jobs, round_kinds = [], []
            for i in range(N):
                body = _body(rng, i)
                if i % 3:  # two clients in three hang up: while queued, mid-synthesis or mid-stream
                    how = rng.choice(["waiting", "streaming", "streaming", "mid-stream"])
                    after = rng.choice([0.001, 0.005, 0.02, rng.uniform(0.05, 1.5)])
                    jobs.append(_hang_up(c, body, after, how))
                    round_kinds.append("hang-up")
                else:
                    jobs.append((_complete_sse if rng.random() < 0.5 else _complete_wav)(c, body))
                    round_kinds.append("complete")
            results = await asyncio.gather(*jobs)
            problems += [r for r, k in zip(results, round_kinds) if k == "complete" and r is not None]
            kinds += round_kinds
    storm_s = time.monotonic() - t0
    assert problems == [], problems
    deadline = time.monotonic() + 15
    while 'cosyvoice_inflight_requests 0.0' not in s.metrics():
        assert time.monotonic() < deadline, "slots of hung-up clients are still held"
        time.sleep(0.1)
    log = s.log()
    assert "Traceback" not in log and "failed; failing" not in log, log[-3000:]
    after = httpx.post(s.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Still fine.", "response_format": "wav",
                                                           "stream": False}, timeout=60)
    assert after.status_code == 200
    print(f"storm: {len(kinds)} clients ({kinds.count('hang-up')} hang-ups) in {storm_s:.1f} s")
