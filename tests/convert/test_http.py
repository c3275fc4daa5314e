"""End to end through the HTTP API: a converted checkpoint served by `cosyvoice-server serve`, against
upstream's inference on the same checkpoint (greedy decoding, SFT and zero-shot speakers from spk2info).

With the request's seed the server's vocoder noise is reproducible, so the reference draws the same
noise and the audio must agree sample for sample (16-bit PCM), streamed and not, alone and in a batch.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest
from reference import log_mel

from cosyvoice_server.scheduling.request import request_rngs

PCM_TOL = 1e-4 + 1 / 32767  # float parity plus 16-bit truncation
WORDS = "Hello world, this is a small test of speech synthesis with streaming chunks.".split()


@pytest.fixture
def served(converted, start_server):
    return start_server("--model-dir", str(converted))


def _expected(pipeline, reference, text, voice, stream, seed, speed=1.0):
    tokens_in = pipeline.frontend.segments(text)[0].tolist()
    spk = reference.speaker(voice)
    tokens = reference.tokens(tokens_in, spk)
    noise_rng = request_rngs(seed)[1]
    chunks = reference.tts(tokens, spk, stream, lambda n: noise_rng.standard_normal((n, 9), np.float32), speed)
    return tokens, np.concatenate(chunks)


async def _speak(client, url, text, voice, stream, seed, speed=1.0):
    body = {"model": "tts-1", "input": text, "voice": voice, "response_format": "pcm", "stream": stream, "seed": seed,
            "speed": speed}
    r = await client.post(url + "/v1/audio/speech", json=body)
    assert r.status_code == 200, r.text
    return r, np.frombuffer(r.content, "<i2").astype(np.float32) / 32767


CASES = [(" ".join(WORDS[: 3 + 2 * i]), ["spk_a", "spk_b"][i % 2], i % 3 != 0, 100 + i) for i in range(8)]


def test_a_converted_model_lists_its_instructions_and_markup_tags(served):
    caps = httpx.get(served.url + "/v1/models").json()["data"][0]["capabilities"]
    assert caps["instructions"] is True  # <|endofprompt|> is in upstream's tokenizer
    assert {"[breath]", "[laughter]", "<strong>", "</strong>"} <= set(caps["tags"])
    assert not [t for t in caps["tags"] if t.startswith("<|")]


def test_alone_streamed_and_not_matches_upstream(served, pipeline, reference):
    async def run():
        async with httpx.AsyncClient(timeout=120) as c:
            return [await _speak(c, served.url, " ".join(WORDS), "spk_b", stream, 7) for stream in (False, True)]

    for (r, audio), stream in zip(asyncio.run(run()), (False, True)):
        tokens, want = _expected(pipeline, reference, " ".join(WORDS), "spk_b", stream, 7)
        assert int(r.headers.get("x-speech-tokens", len(tokens))) == len(tokens)
        assert audio.shape == want.shape
        err = float(np.abs(audio - want).max())
        print(f"\nPARITY HTTP {'streamed' if stream else 'whole'} ({len(tokens)} tokens): max abs {err:.2e}")
        assert err <= PCM_TOL


def test_a_batch_of_8_mixed_requests_matches_upstream_one_by_one(served, pipeline, reference):
    async def run():
        async with httpx.AsyncClient(timeout=300) as c:
            return await asyncio.gather(*[_speak(c, served.url, *case) for case in CASES])

    results = asyncio.run(run())
    worst = 0.0
    for (text, voice, stream, seed), (_, audio) in zip(CASES, results):
        _, want = _expected(pipeline, reference, text, voice, stream, seed)
        assert audio.shape == want.shape
        worst = max(worst, float(np.abs(audio - want).max()))
    print(f"\nPARITY HTTP batch of 8 (mixed lengths, voices, streamed and not): max abs {worst:.2e}")
    assert worst <= PCM_TOL


def test_speed_stretches_the_whole_response_as_upstream(served, pipeline, reference):
    async def run():
        async with httpx.AsyncClient(timeout=120) as c:
            return await _speak(c, served.url, " ".join(WORDS[:6]), "spk_a", False, 3, 1.5)

    _, audio = asyncio.run(run())
    _, want = _expected(pipeline, reference, " ".join(WORDS[:6]), "spk_a", False, 3, 1.5)
    assert audio.shape == want.shape
    assert float(np.abs(audio - want).max()) <= PCM_TOL


def test_unseeded_requests_are_as_close_to_upstream_as_upstream_is_to_itself(served, pipeline, reference):
    """Without a seed the vocoder noise differs run to run, in upstream too: compare log-mel distances."""
    text = " ".join(WORDS[:8])

    async def run():
        async with httpx.AsyncClient(timeout=120) as c:
            r = await c.post(served.url + "/v1/audio/speech", json={"model": "tts-1", "input": text, "voice": "spk_a",
                                                                   "response_format": "pcm"})
            return np.frombuffer(r.content, "<i2").astype(np.float32) / 32767

    audio = asyncio.run(run())
    tokens_in = pipeline.frontend.segments(text)[0].tolist()
    spk = reference.speaker("spk_a")
    tokens = reference.tokens(tokens_in, spk)
    a, b = (np.concatenate(reference.tts(tokens, spk, False)) for _ in range(2))
    self_dist = float(np.abs(log_mel(a) - log_mel(b)).mean())
    dist = float(np.abs(log_mel(audio) - log_mel(a)).mean())
    print(f"\nPARITY HTTP unseeded log-mel distance {dist:.3f} (upstream vs itself {self_dist:.3f})")
    assert audio.shape == a.shape
    assert dist <= 1.5 * self_dist + 1e-3


def _metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


def test_streamed_segments_free_their_flow_cache_when_they_end_or_their_client_leaves(served):
    """A long streamed request whose client leaves after its first audio, then one read to its end: the
    flow cache memory goes back to zero either way, and the stages' measured batch limits are published."""
    text = " ".join(WORDS * 6)

    async def run():
        async with httpx.AsyncClient(timeout=120) as c:
            body = {"model": "tts-1", "input": text, "voice": "spk_b", "response_format": "pcm", "stream": True}
            async with c.stream("POST", served.url + "/v1/audio/speech", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    break  # leave mid-stream
            r = await c.post(served.url + "/v1/audio/speech", json=body)
            assert r.status_code == 200 and len(r.content) > 0

    asyncio.run(run())
    deadline = time.monotonic() + 10
    while _metric(served.metrics(), "cosyvoice_flow_cache_bytes") != 0.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    metrics = served.metrics()
    assert _metric(metrics, "cosyvoice_flow_cache_bytes") == 0.0
    for stage in ("llm", "flow", "vocoder"):
        assert _metric(metrics, f'cosyvoice_stage_max_batch_size{{stage="{stage}"}}') >= 1
