"""POST/GET/DELETE /v1/audio/voices on a real server: bad uploads refused in OpenAI's shape with the store
untouched, registration with and without a transcript, key scopes, the registration concurrency bound."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from clips import encode, speech_like, wav
from voicekit import ADMIN, SYNTH, extraction_workers, policies, register, tree

SCHED_IDLE = 5  # Linux's policy number (os.SCHED_IDLE)
SENTENCE = "Registered voices speak any text."


def error_of(r: httpx.Response, status: int, code: str, param: str | None = "audio") -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and err["param"] == param, err
    assert err["message"] and "Traceback" not in err["message"]
    return err["message"]


STEREO = encode(speech_like(5.0, 48000, channels=2), 48000)
MP3 = encode(speech_like(5.0, 48000), 48000, "MP3")

# (case, name, audio bytes, filename, status, code, param): the bad uploads a new user tries first.
BAD = [
    ("empty", "empty", b"", "clip.wav", 400, "empty_file", "audio"),
    ("40 s", "long", wav(40.0, 16000), "clip.wav", 400, "audio_too_long", "audio"),
    ("8 kHz", "low-rate", wav(5.0, 8000), "clip.wav", 400, "sample_rate_too_low", "audio"),
    ("corrupt header", "corrupt", b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\xff\xff" + bytes(5000), "clip.wav",
     400, "invalid_audio", "audio"),
    ("mp3 renamed .wav", "renamed", MP3, "clip.wav", 400, "audio_type_mismatch", "audio"),
    ("stereo 48 kHz", "stereo", STEREO, "clip.wav", 400, "audio_not_mono", "audio"),
    ("silence", "silence", encode(np.zeros(48000 * 5, np.float32), 48000), "clip.wav", 400, "audio_silent", "audio"),
    ("too short", "short", wav(0.3), "clip.wav", 400, "audio_too_short", "audio"),
    ("10 MB", "big", b"RIFF" + bytes(10_000_000), "clip.wav", 413, "request_too_large", "audio"),
    ("unicode name", "stimme-über", wav(), "clip.wav", 400, "invalid_voice_name", "name"),
    ("path traversal name", "../../etc/passwd", wav(), "clip.wav", 400, "invalid_voice_name", "name"),
    ("upper case name", "Alice", wav(), "clip.wav", 400, "invalid_voice_name", "name"),
    ("bundled name", "default", wav(), "clip.wav", 409, "voice_exists", "name"),
    ("alias name", "alloy", wav(), "clip.wav", 409, "voice_exists", "name"),
    ("missing name", None, wav(), "clip.wav", 400, "missing_required_parameter", "name"),
    ("missing audio", "no-audio", None, "clip.wav", 400, "missing_required_parameter", "audio"),
    ("unsupported type", "m4a", wav(), "clip.m4a", 400, "unsupported_audio_format", "audio"),
]


@pytest.fixture(scope="module")
def alice(replica_a):
    r = register(replica_a.url, "alice", wav(5.0, 48000), transcript="Hello, this is Alice speaking.")
    assert r.status_code == 201, r.text
    return r


@pytest.mark.parametrize("case, name, audio, filename, status, code, param", BAD, ids=[b[0] for b in BAD])
def test_bad_uploads_are_refused_and_leave_the_store_unchanged(replica_a, store, alice, case, name, audio, filename,
                                                               status, code, param):
    before = tree(store)
    r = register(replica_a.url, name, audio, filename)
    error_of(r, status, code, param)
    assert tree(store) == before
    if name and name != "default" and name != "alloy":
        assert httpx.get(f"{replica_a.url}/v1/audio/voices/{name}", headers=SYNTH).status_code in (404, 400)


def test_a_duplicate_name_is_409_and_keeps_the_first_voice(replica_a, store, alice):
    before = tree(store)
    msg = error_of(register(replica_a.url, "alice", wav(6.0), transcript="Another clip."), 409, "voice_exists", "name")
    assert "already registered" in msg
    assert tree(store) == before


def test_other_bodies_are_refused_in_openai_shape(replica_a, store, alice):
    before = tree(store)
    r = httpx.post(replica_a.url + "/v1/audio/voices", json={"name": "json", "audio": "..."}, headers=ADMIN)
    error_of(r, 415, "unsupported_media_type", None)
    r = httpx.post(replica_a.url + "/v1/audio/voices", data={"name": "text", "audio": "not a file"}, headers=ADMIN)
    error_of(r, 415, "unsupported_media_type", None)  # a url-encoded form cannot carry a file
    r = httpx.post(replica_a.url + "/v1/audio/voices", data={"name": "text", "audio": "not a file"},
                   files={"note": ("note.txt", b"x")}, headers=ADMIN)
    error_of(r, 400, "invalid_value", "audio")
    r = httpx.post(replica_a.url + "/v1/audio/voices", content=b"--x\r\nbroken", headers={
        **ADMIN, "content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400 and r.json()["error"]["code"] in ("invalid_multipart", "missing_required_parameter")
    error_of(register(replica_a.url, "long-text", wav(), transcript="a" * 5000), 400, "invalid_value", "transcript")
    assert tree(store) == before


def test_registration_needs_the_registration_key(replica_a, store, alice):
    before = tree(store)
    error_of(register(replica_a.url, "bob", wav(), headers=SYNTH), 403, "insufficient_scope", None)
    error_of(register(replica_a.url, "bob", wav(), headers={}), 401, "invalid_api_key", None)
    r = httpx.delete(replica_a.url + "/v1/audio/voices/alice", headers=SYNTH)
    error_of(r, 403, "insufficient_scope", None)
    assert tree(store) == before
    # the registration key may also do what the synthesis key does
    assert httpx.get(replica_a.url + "/v1/audio/voices", headers=ADMIN).status_code == 200


def test_a_voice_from_a_clip_with_its_transcript(replica_a, alice):
    card = alice.json()
    assert alice.headers["location"] == "/v1/audio/voices/alice"
    assert card["id"] == card["name"] == "alice" and card["object"] == "voice"
    assert card["type"] == "registered" and card["mode"] == "zero_shot"
    assert card["transcript"] == "Hello, this is Alice speaking."
    assert (card["duration_seconds"], card["sample_rate"], card["samples"]) == (5.0, 48000, 240000)
    assert card["prompt_speech_tokens"] > 0 and card["created_at"] > 0
    assert httpx.get(replica_a.url + "/v1/audio/voices/alice", headers=ADMIN).json() == card
    # the synthesis key sees the voice, not what its speaker said nor who registered it
    assert httpx.get(replica_a.url + "/v1/audio/voices/alice", headers=SYNTH).json() == {
        k: v for k, v in card.items() if k not in ("transcript", "owner")}


@pytest.mark.parametrize("fmt", ["FLAC", "MP3", "OGG"])
def test_a_voice_without_transcript_is_cross_lingual(replica_a, fmt):
    name = f"carol-{fmt.lower()}"
    r = register(replica_a.url, name, encode(speech_like(4.0, 44100, seed=3), 44100, fmt), f"carol.{fmt.lower()}")
    assert r.status_code == 201, r.text
    card = r.json()
    assert card["mode"] == "cross_lingual" and card["transcript"] is None
    assert card["duration_seconds"] == pytest.approx(4.0, abs=0.1)
    r = httpx.post(replica_a.url + "/v1/audio/speech", headers=SYNTH, json={
        "model": "tts-1", "input": SENTENCE, "voice": name, "response_format": "wav", "stream": False, "seed": 1})
    assert r.status_code == 200, r.text
    assert httpx.delete(f"{replica_a.url}/v1/audio/voices/{name}", headers=ADMIN).status_code == 200


def test_listing_types_every_voice(replica_a, alice):
    listing = httpx.get(replica_a.url + "/v1/audio/voices", headers=SYNTH).json()
    by_id = {v["id"]: v for v in listing["voices"]}
    assert by_id["alice"]["type"] == "registered"
    assert {by_id[n]["type"] for n in ("default", "bright", "warm")} == {"bundled"}
    assert by_id["default"]["mode"] == "sft" and by_id["warm"]["mode"] == "zero_shot"
    assert "alloy" in by_id["default"]["aliases"]


def test_a_registered_voice_speaks_and_differs_from_the_bundled_ones(replica_a, alice):
    def pcm(voice):
        r = httpx.post(replica_a.url + "/v1/audio/speech", headers=SYNTH, timeout=60, json={
            "model": "tts-1", "input": SENTENCE, "voice": voice, "response_format": "pcm", "stream": False, "seed": 4})
        assert r.status_code == 200, r.text
        return r.content

    own = pcm("alice")
    assert pcm({"id": "alice"}) == own  # OpenAI's voice object
    assert own not in {pcm(v) for v in ("default", "bright", "warm")}


def test_bundled_voices_cannot_be_deleted(replica_a):
    error_of(httpx.delete(replica_a.url + "/v1/audio/voices/default", headers=ADMIN), 409, "bundled_voice", "name")
    error_of(httpx.delete(replica_a.url + "/v1/audio/voices/alloy", headers=ADMIN), 409, "bundled_voice", "name")
    error_of(httpx.delete(replica_a.url + "/v1/audio/voices/nobody", headers=ADMIN), 404, "voice_not_found", "name")
    r = httpx.delete(replica_a.url + "/v1/audio/voices/..%2F..%2Fetc", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] in ("not_found", "voice_not_found")


def test_an_unknown_voice_points_at_the_listing(replica_a):
    r = httpx.post(replica_a.url + "/v1/audio/speech", headers=SYNTH, json={"model": "tts-1", "input": "Hi.",
                                                                            "voice": "nobody"})
    msg = error_of(r, 400, "invalid_voice", "voice")
    assert "registered voice (GET /v1/audio/voices)" in msg


def test_registrations_beyond_the_bound_get_429(replica_a, store):
    clip_30s = wav(29.0, 48000)
    results: list[httpx.Response] = []

    def go(i: int) -> None:
        results.append(register(replica_a.url, f"burst-{i}", clip_30s, transcript="Burst."))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert 201 in codes and 429 in codes, [r.text for r in results]
    for r in results:
        if r.status_code == 429:
            error_of(r, 429, "registration_busy", None)
            assert r.headers["retry-after"] == "1"
        else:
            httpx.delete(f"{replica_a.url}/v1/audio/voices/{r.json()['id']}", headers=ADMIN)


def test_registration_metrics(replica_a, alice):
    text = replica_a.metrics()
    assert 'cosyvoice_voice_registrations_total{result="ok"}' in text
    assert 'cosyvoice_voice_registrations_total{result="audio_too_long"} 1.0' in text
    assert 'cosyvoice_voice_registrations_total{result="voice_exists"}' in text
    assert "cosyvoice_voice_registration_seconds_count" in text
    assert 'cosyvoice_voice_cache_lookups_total{result="hit"}' in text
    registered = next(line for line in text.splitlines() if line.startswith("cosyvoice_registered_voices "))
    assert float(registered.split()[1]) >= 1
    cache = next(line for line in text.splitlines() if line.startswith("cosyvoice_voice_cache_bytes "))
    assert float(cache.split()[1]) > 0


def test_extraction_runs_in_a_background_child_process(replica_a, alice):
    from cosyvoice_server.voices.worker import FALLBACK_NICE

    server = replica_a.proc.pid
    workers = extraction_workers(server)
    # one worker (the default concurrency), every thread of it (its BLAS threads too) in the background;
    # the server's own threads keep the ordinary policy and priority
    assert len(workers) == 1, workers
    threads = policies(workers[0])
    assert {policy for policy, _ in threads} == {SCHED_IDLE} or threads == {(0, FALLBACK_NICE)}
    assert {policy for policy, _ in policies(server)} == {0}


def test_a_killed_extraction_worker_is_replaced(replica_a):
    server = replica_a.proc.pid
    [worker] = extraction_workers(server)
    os.kill(worker, signal.SIGKILL)
    r = register(replica_a.url, "after-crash", wav(5.0, 48000), transcript="Hello again.")
    error_of(r, 503, "registration_unavailable", None)
    assert r.headers["retry-after"] == "1"
    r = register(replica_a.url, "after-crash", wav(5.0, 48000), transcript="Hello again.")
    assert r.status_code == 201, r.text
    [replacement] = extraction_workers(server)
    assert replacement != worker
    httpx.delete(f"{replica_a.url}/v1/audio/voices/after-crash", headers=ADMIN)
