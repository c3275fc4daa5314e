"""The official `openai` Python SDK against a real server process, used the way its documentation shows."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import av
import httpx
import numpy as np
import openai
import pytest

LONG = " ".join(["The streaming pattern of the SDK should hear the first words long before the last."] * 16)
SAMPLES_PER_TOKEN = 960


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def whole_pcm_samples(url: str, seed: int) -> int:
    r = httpx.post(url + "/v1/audio/speech", timeout=120, json={
        "model": "tts-1", "voice": "alloy", "input": LONG, "response_format": "pcm", "stream": False, "seed": seed})
    assert r.status_code == 200, r.text
    assert len(r.content) == int(r.headers["x-speech-tokens"]) * SAMPLES_PER_TOKEN * 2
    return len(r.content) // 2


def decoded_samples(fmt: str, data: bytes) -> int:
    if fmt == "pcm":
        return len(data) // 2
    with av.open(io.BytesIO(data)) as f:
        assert f.streams.audio[0].rate == 24000
        return sum(frame.samples for frame in f.decode(audio=0))


@pytest.mark.parametrize("fmt", [None, "wav", "pcm", "aac"])  # None: the SDK's default, mp3
def test_sdk_streaming_pattern_hears_audio_long_before_the_end(client, server, fmt):
    seed = 31
    expected = whole_pcm_samples(server.url, seed)
    kwargs = {"response_format": fmt} if fmt else {}
    t0 = time.monotonic()
    first, parts = None, []
    # as documented by OpenAI; only the seed (an extension) is added, so the two runs say the same thing
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=LONG, extra_body={"seed": seed}, **kwargs) as response:
        for part in response.iter_bytes():
            if first is None and part:
                first = time.monotonic() - t0
            parts.append(part)
    total = time.monotonic() - t0
    assert first is not None and first < 0.3 * total, f"first audio at {first:.3f}s of {total:.3f}s"
    n = decoded_samples(fmt or "mp3", b"".join(parts))
    # the lossy codecs add their encoder delay and pad the last frame
    assert 0 <= n - expected <= (0 if fmt in ("wav", "pcm") else 3 * 1152), (n, expected)


def test_sdk_voice_object_and_whole_response(client):
    audio = client.audio.speech.create(model="tts-1", voice={"id": "nova"}, input="Hello there.", response_format="wav")
    with av.open(io.BytesIO(audio.content)) as f:
        samples = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)])
    assert len(samples) > 0 and len(samples) % SAMPLES_PER_TOKEN == 0


def test_sdk_gets_typed_errors(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.speech.create(model="tts-1", voice="nobody", input="Hello.")
    assert bad.value.code == "invalid_voice" and bad.value.param == "voice"
    with pytest.raises(openai.NotFoundError) as missing:
        client.audio.speech.create(model="whisper-1", voice="alloy", input="Hello.")
    assert missing.value.code == "model_not_found"


def test_sdk_retrieves_the_served_model_by_its_id_or_an_openai_name(client):
    listed = client.models.list().data[0]
    for name in (listed.id, "tts-1", "gpt-4o-mini-tts"):
        model = client.models.retrieve(name)
        assert model.model_dump() == listed.model_dump()
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("whisper-1")
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    assert "whisper-1" in missing.value.message


def test_readme_sdk_example_runs_as_written(server, tmp_path, monkeypatch):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(from openai import OpenAI\n.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(code.replace("http://localhost:8000", server.url), {})
    assert decoded_samples("mp3", (tmp_path / "hello.mp3").read_bytes()) > 0
