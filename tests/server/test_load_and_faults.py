"""Batching, overload, deadlines, disconnects, draining and start-up failures, against real processes."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import soundfile as sf
from prometheus_client.parser import text_string_to_metric_families

LONG = " ".join(["Streaming speech synthesis keeps going for quite a while here."] * 30)


def body(text: str = "Batching brings many requests together.", **kw) -> dict:
    """A whole-file request (its status and headers say how it ended) unless kw says stream=True."""
    return {"model": "tts-1", "input": text, "response_format": "wav", "stream": False} | kw


def histogram(metrics: str, name: str, label: str, value: str) -> dict[str, float]:
    """Bucket upper bound -> cumulative count for one labelled histogram."""
    out = {}
    for fam in text_string_to_metric_families(metrics):
        if fam.name == name:
            for s in fam.samples:
                if s.name == name + "_bucket" and s.labels.get(label) == value:
                    out[s.labels["le"]] = s.value
    return out


async def fire(url: str, n: int, clients: int = 4, **kw) -> list[httpx.Response]:
    pool = [httpx.AsyncClient(base_url=url, timeout=120) for _ in range(clients)]
    try:
        return await asyncio.gather(*[pool[i % clients].post("/v1/audio/speech", json=body(seed=i, **kw)) for i in range(n)])
    finally:
        await asyncio.gather(*[c.aclose() for c in pool])


def wav_ok(r: httpx.Response) -> bool:
    audio, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    return sr == 24000 and len(audio) == int(r.headers["x-speech-tokens"]) * 960


async def test_concurrent_load_batches_every_stage(start_server):
    # Stage limits set, not measured: a start-up probe on a machine this suite loads may find no gain.
    s = start_server("--max-batch-size", "16", "--flow-max-batch", "16", "--vocoder-max-batch", "16")
    rs = await fire(s.url, 32)
    assert [r.status_code for r in rs] == [200] * 32
    assert all(wav_ok(r) for r in rs)
    metrics = s.metrics()
    for stage in ("llm", "flow", "vocoder"):
        buckets = histogram(metrics, "cosyvoice_batch_size", "stage", stage)
        batches, single = buckets["+Inf"], buckets["1.0"]
        assert batches - single > 0, f"{stage}: no batch larger than 1 ({buckets})"


async def test_overload_answers_429_with_retry_after_and_completes_the_rest(start_server):
    s = start_server("--max-batch-size", "2", "--max-queue-size", "2")
    rs = await fire(s.url, 24, clients=8)
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 429}
    assert codes.count(429) > 0 and codes.count(200) >= 4
    for r in rs:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "server_overloaded"
        else:
            assert wav_ok(r)
    assert 'cosyvoice_requests_total{code="429"}' in s.metrics()
    # once the burst is over, the server accepts again
    assert httpx.post(s.url + "/v1/audio/speech", json=body(), timeout=60).status_code == 200


def test_deadline_exceeded_gives_504_and_frees_the_slot(start_server):
    s = start_server("--request-timeout-s", "0.3", "--max-batch-size", "1", "--max-queue-size", "0")
    t0 = time.monotonic()
    r = httpx.post(s.url + "/v1/audio/speech", json=body(LONG), timeout=30)
    assert r.status_code == 504
    assert time.monotonic() - t0 < 3
    err = r.json()["error"]
    assert err["code"] == "timeout" and "0.3 s" in err["message"]
    # capacity 1: the timed-out request no longer holds it
    ok = httpx.post(s.url + "/v1/audio/speech", json=body("Short."), timeout=30)
    assert ok.status_code == 200


def test_a_stream_past_its_deadline_never_looks_complete(start_server):
    s = start_server("--request-timeout-s", "0.3", "--max-batch-size", "1", "--max-queue-size", "0")
    body_ = {"model": "tts-1", "input": LONG, "response_format": "pcm"}  # streamed, as by default
    with httpx.stream("POST", s.url + "/v1/audio/speech", json=body_, timeout=30) as r:
        if r.status_code == 200:  # audio flowed before the deadline: the transfer must break, not end cleanly
            with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
                for _ in r.iter_raw():
                    pass
        else:  # the deadline came before any audio: an error response, as without streaming
            assert r.status_code == 504 and json.loads(r.read())["error"]["code"] == "timeout"
    assert httpx.post(s.url + "/v1/audio/speech", json=body("Short."), timeout=30).status_code == 200
    assert "Traceback" not in s.log()


def metric(s, name: str) -> float:
    for fam in text_string_to_metric_families(s.metrics()):
        for sample in fam.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    raise KeyError(name)


def test_client_disconnect_frees_its_slot(start_server):
    """The slot is freed because the client left, not because the synthesis ran to its end: the slot
    must be free well before the whole request would have finished (a second, or 40 % of its time on a
    loaded machine), and far less audio than the whole request must have been synthesized (the
    request, slowed-down speech, runs several times longer than the 0.3 s the client waits)."""
    s = start_server("--max-batch-size", "1", "--max-queue-size", "0")
    slow = body(LONG, speed=0.5)
    t0 = time.monotonic()
    full = httpx.post(s.url + "/v1/audio/speech", json=slow, timeout=120)
    bound = max(1.0, 0.4 * (time.monotonic() - t0))
    assert full.status_code == 200
    full_audio_s = float(full.headers["x-audio-duration-seconds"])
    for stream in (True, False):
        before = metric(s, "cosyvoice_audio_seconds_total")
        with httpx.Client(base_url=s.url, timeout=30) as c:
            if stream:
                with c.stream("POST", "/v1/audio/speech", json=slow | {"stream": True}) as r:
                    assert r.status_code == 200
                    next(r.iter_raw())  # audio is flowing, then the client hangs up
            else:
                with pytest.raises(httpx.ReadTimeout):
                    c.post("/v1/audio/speech", json=slow, timeout=0.3)
        hung_up = time.monotonic()
        while time.monotonic() - hung_up < bound and metric(s, "cosyvoice_inflight_requests") != 0:
            time.sleep(0.02)
        assert metric(s, "cosyvoice_inflight_requests") == 0, f"stream={stream}: slot still held after {bound:.1f} s"
        produced = metric(s, "cosyvoice_audio_seconds_total") - before
        assert produced < 0.6 * full_audio_s, f"stream={stream}: {produced:.1f} of {full_audio_s:.1f} s synthesized"
        assert httpx.post(s.url + "/v1/audio/speech", json=body("Short."), timeout=30).status_code == 200


async def test_sigterm_drains_accepted_requests_then_exits_0(start_server):
    s = start_server("--drain-timeout-s", "60")
    async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:
        tasks = [asyncio.create_task(client.post("/v1/audio/speech", json=body(LONG[:1500], seed=i))) for i in range(4)]
        while 'cosyvoice_inflight_requests 4.0' not in (await client.get("/metrics")).text:
            await asyncio.sleep(0.02)
        s.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        ready = await client.get("/readyz")
        late = await client.post("/v1/audio/speech", json=body())
        done = await asyncio.gather(*tasks)
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
    assert [r.status_code for r in done] == [200] * 4
    assert all(wav_ok(r) for r in done)
    assert s.proc.wait(30) == 0


def test_api_key_guards_v1_but_not_probes(start_server):
    s = start_server(env={"COSYVOICE_API_KEY": "s3cret"})
    r = httpx.post(s.url + "/v1/audio/speech", json=body())
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(s.url + "/v1/audio/speech", json=body(), headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = httpx.post(s.url + "/v1/audio/speech", json=body(), headers={"Authorization": "Bearer s3cret"}, timeout=30)
    assert ok.status_code == 200
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(s.url + path).status_code == 200


def test_api_key_from_a_mounted_secret_file(start_server, tmp_path):
    key = tmp_path / "key"
    key.write_text("from-file\n")
    s = start_server("--api-key-file", str(key))
    assert httpx.get(s.url + "/v1/models").status_code == 401
    assert httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer from-file"}).status_code == 200
    # two Authorization headers, one right: refused, the server does not pick one
    two = httpx.Headers([("Authorization", "Bearer from-file"), ("Authorization", "Bearer wrong")])
    assert httpx.get(s.url + "/v1/models", headers=two).status_code == 401


def test_a_rotated_key_file_takes_effect_without_a_restart(start_server, tmp_path):
    """As Kubernetes updates a mounted Secret: a new file swapped in through a symlink. The old key stops
    working within seconds; a file that becomes empty keeps the last key (authentication never turns off)."""
    data = tmp_path / "..data-1"
    data.mkdir()
    (data / "key").write_text("first-key\n")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "key").symlink_to("..data/key")
    s = start_server("--api-key-file", str(tmp_path / "key"))

    def status(key: str) -> int:
        return httpx.get(s.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code

    def swap(text: str, n: int) -> None:
        new = tmp_path / f"..data-{n}"
        new.mkdir()
        (new / "key").write_text(text)
        (tmp_path / "..data-tmp").symlink_to(new.name)
        os.replace(tmp_path / "..data-tmp", tmp_path / "..data")

    assert status("first-key") == 200
    swap("second-key\n", 2)
    deadline = time.monotonic() + 10
    while status("first-key") != 401:
        assert time.monotonic() < deadline, "the old key still works"
        time.sleep(0.2)
    assert status("second-key") == 200
    swap("", 3)
    time.sleep(1.5)
    assert status("second-key") == 200 and httpx.get(s.url + "/v1/models").status_code == 401
    assert "holds no key; the previous key stays in force" in s.log()


def serve_fails(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYVOICE_")}
    return subprocess.run([sys.executable, "-m", "cosyvoice_server.cli", "serve", "--port", "1", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_device_cuda_without_cuda_fails_with_a_clear_message():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has the CUDA provider")
    r = serve_fails("--device", "cuda")
    assert r.returncode == 2
    assert "--device cuda was requested but cannot be used" in r.stderr
    assert "onnxruntime-gpu" in r.stderr and "Traceback" not in r.stderr


def test_environment_variables_configure_serve(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYVOICE_")} | {"COSYVOICE_MODEL_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "cosyvoice_server.cli", "serve", "--port", "1"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2 and f"{tmp_path}/model.yaml: missing" in r.stderr
    env["COSYVOICE_MAX_BATCH_SIZE"] = "0"
    r = subprocess.run([sys.executable, "-m", "cosyvoice_server.cli", "serve"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "max_batch_size" in r.stderr


def test_doctor_reports_runtime_and_what_cuda_lacks():
    import onnxruntime as ort

    r = subprocess.run([sys.executable, "-m", "cosyvoice_server.cli", "doctor"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert f"onnxruntime {ort.__version__}" in r.stdout
    assert "NVIDIA driver:" in r.stdout
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert "--device cuda: NOT usable" in r.stdout and "onnxruntime-gpu" in r.stdout


def test_a_request_timeout_shorter_than_warm_up_does_not_stop_start_up(start_server):
    # Warm-up synthesises a sentence, which takes longer than 10 ms on any device.
    s = start_server("--request-timeout-s", "0.01")
    r = httpx.post(s.url + "/v1/audio/speech", json=body("Short."), timeout=30)
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
