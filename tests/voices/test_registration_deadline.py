"""A voice registration that cannot be extracted in time (its worker gets no CPU) is answered with 503
and Retry-After at the server's deadline, stores nothing, and does not hold the worker: a fresh one takes
the next registration."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from clips import wav
from voicekit import ADMIN, extraction_workers, register, registering_server, tree

TIMEOUT_S = 5


def test_a_registration_past_its_deadline_gets_503_and_stores_nothing(server_process, tmp_path):
    store = tmp_path / "voices"
    store.mkdir()
    s = registering_server(server_process, tmp_path, store, "--voice-registration-timeout-s", str(TIMEOUT_S)).wait_ready()
    try:
        [worker] = extraction_workers(s.proc.pid)
        os.kill(worker, signal.SIGSTOP)  # as starved as SCHED_IDLE gets on a saturated CPU
        before = tree(store)
        started = time.monotonic()
        r = register(s.url, "late", wav(5.0, 48000), transcript="Too late.")
        took = time.monotonic() - started
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "registration_timeout" and err["type"] == "server_error" and err["param"] is None
        assert f"within {TIMEOUT_S} s" in err["message"] and "Nothing was stored" in err["message"]
        assert int(r.headers["retry-after"]) > 0
        assert TIMEOUT_S - 0.5 <= took < TIMEOUT_S + 10
        assert tree(store) == before
        assert httpx.get(s.url + "/v1/audio/voices/late", headers=ADMIN).status_code == 404
        assert 'cosyvoice_voice_registrations_total{result="registration_timeout"} 1.0' in s.metrics()

        # The stopped worker was killed, not left holding the slot: a replacement registers the voice.
        deadline = time.monotonic() + 240
        while (r := register(s.url, "late", wav(5.0, 48000), transcript="In time.")).status_code == 503:
            assert r.json()["error"]["code"] == "registration_timeout", r.text  # the replacement is starting
            assert time.monotonic() < deadline, "no replacement worker took the registration"
        assert r.status_code == 201, r.text
        assert not Path(f"/proc/{worker}").exists() or Path(f"/proc/{worker}/stat").read_text().split()[2] == "Z"
        [replacement] = extraction_workers(s.proc.pid)
        assert replacement != worker
    finally:
        s.stop()
