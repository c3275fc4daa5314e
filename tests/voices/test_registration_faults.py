"""Registration under the audit's hostile inputs, on a real server: any run of bad clips leaves registration
working, and registrations that cannot finish hold nothing that synthesis needs."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from clips import encode, speech_like, wav
from voicekit import ADMIN, SYNTH, extraction_workers, register, registering_server

WORKERS = 6  # the event loop's default executor has min(32, cores + 4) threads: 6 on two cores
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def server(server_process, tmp_path_factory):
    store = tmp_path_factory.mktemp("voices")
    s = registering_server(server_process, tmp_path_factory.mktemp("faults"), store,
                           "--voice-registration-concurrency", str(WORKERS),
                           "--voice-registration-timeout-s", str(TIMEOUT_S)).wait_ready(timeout=180)
    yield s
    s.stop()


def float_wav(audio: np.ndarray, rate: int) -> bytes:
    return encode(audio.astype(np.float32), rate, subtype="FLOAT")


# (clip, transcript, status, code): each used to lose its extraction worker, or to 500, or to take gigabytes
BAD = [
    (wav(3.0), "\u200b\u200b\u200b", 400, "invalid_transcript"),
    (wav(3.0), "\u200b", 400, "invalid_transcript"),
    (float_wav(np.full(48000 * 3, 1e19), 48000), None, 400, "audio_out_of_range"),
    (float_wav(speech_like(3.0, 48000) * 1e19, 48000), "Loud.", 400, "audio_out_of_range"),
    (float_wav(np.where(np.arange(48000 * 3) % 7, 0.1, np.inf), 48000), None, 400, "invalid_audio"),
    (wav(3.0, 200003), None, 400, "sample_rate_too_high"),
    (wav(3.0, 8000), None, 400, "sample_rate_too_low"),
    (encode(speech_like(3.0, 16000), 16000, "AIFF"), None, 400, "unsupported_audio_format"),
]


def test_registration_keeps_working_after_any_run_of_bad_clips(server):
    for data, transcript, status, code in BAD:  # more failures than workers
        r = register(server.url, "bad", data, transcript=transcript)
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code
    started = time.monotonic()
    r = register(server.url, "odd-rate", wav(3.0, 16001), transcript="Hello there.")
    assert r.status_code == 201, r.text
    assert r.json()["sample_rate"] == 16001
    assert time.monotonic() - started < TIMEOUT_S / 2  # no waiting for a worker that never comes back
    assert httpx.get(server.url + "/readyz").status_code == 200
    assert f"cosyvoice_voice_extraction_workers {WORKERS:.1f}" in server.metrics()


def test_stuck_registrations_do_not_hold_up_compressed_speech(server):
    """Each registration waiting for a worker held a thread of the event loop's default executor, which mp3
    encoding used too: with six stuck, a non-streamed mp3 took as long as their deadline."""
    workers = extraction_workers(server.proc.pid)
    assert len(workers) == WORKERS
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)  # as starved as SCHED_IDLE gets on a saturated CPU
    answers: list[int] = []
    try:
        threads = [threading.Thread(target=lambda i=i: answers.append(
            register(server.url, f"stuck-{i}", wav(3.0, 48000), transcript="Stuck.").status_code)) for i in range(WORKERS)]
        for t in threads:
            t.start()
        time.sleep(2)  # every registration is now waiting on its worker
        started = time.monotonic()
        r = httpx.post(server.url + "/v1/audio/speech", headers=SYNTH, timeout=TIMEOUT_S * 2,
                       json={"model": "tts-1", "input": "Still served.", "voice": "default", "response_format": "mp3"})
        took = time.monotonic() - started
        assert r.status_code == 200 and r.content[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3"), r.text
        assert took < 5, f"the mp3 took {took:.1f} s behind {WORKERS} stuck registrations"
    finally:
        for t in threads:  # answered at their deadline, the stopped workers killed
            t.join(TIMEOUT_S * 2)
        for pid in workers:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert answers == [503] * WORKERS  # registration_timeout: the stopped workers are killed and replaced
    deadline = time.monotonic() + 120
    while len(extraction_workers(server.proc.pid)) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.5)
    r = register(server.url, "after", wav(3.0), transcript="Back again.", headers=ADMIN)
    assert r.status_code == 201, r.text
