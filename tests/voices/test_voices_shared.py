"""Two server processes on one store directory, as replicas on one ReadWriteMany volume: a voice registered
through one is served by the other (plain and streamed), deleted through either, gone for both, and still
there after a restart."""

from __future__ import annotations

import subprocess
import sys
import threading

import httpx
import pytest

from clips import encode, speech_like, wav
from voicekit import ADMIN, API_KEY, SYNTH, register, registering_server

SENTENCE = "One replica registers, every replica speaks."


@pytest.fixture(scope="module")
def replica_b(server_process, tmp_path_factory, store, replica_a):
    s = registering_server(server_process, tmp_path_factory.mktemp("b"), store).wait_ready()
    yield s
    s.stop()


def speak(url: str, voice, stream: bool) -> bytes:
    body = {"model": "tts-1", "input": SENTENCE, "voice": voice, "response_format": "pcm", "stream": stream, "seed": 3}
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, headers=SYNTH, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert ("content-length" in r.headers) != stream  # streamed: chunked as it is generated
        data = b"".join(r.iter_bytes())
    assert len(data) > 0
    return data


def names(url: str) -> set[str]:
    return {v["id"] for v in httpx.get(url + "/v1/audio/voices", headers=SYNTH).json()["voices"] if v["type"] == "registered"}


def test_registered_on_one_replica_served_by_the_other_then_deleted_there(replica_a, replica_b):
    with_text = register(replica_a.url, "narrator", wav(5.0, 48000), transcript="This is how I sound when I read.")
    without = register(replica_a.url, "globetrotter", encode(speech_like(5.0, 22050, seed=5), 22050, "FLAC"), "g.flac")
    assert with_text.status_code == 201 and without.status_code == 201, (with_text.text, without.text)
    assert {"narrator", "globetrotter"} <= names(replica_b.url)
    assert httpx.get(replica_b.url + "/v1/audio/voices/narrator", headers=ADMIN).json() == with_text.json()
    for voice in ("narrator", "globetrotter"):
        plain_b, streamed_b = speak(replica_b.url, voice, False), speak(replica_b.url, {"id": voice}, True)
        assert len(plain_b) == len(streamed_b)  # the same speech tokens, decoded whole or in chunks
        assert plain_b == speak(replica_a.url, voice, False)  # the same tensors on both replicas
    assert speak(replica_b.url, "narrator", False) != speak(replica_b.url, "globetrotter", False)

    r = httpx.delete(replica_b.url + "/v1/audio/voices/narrator", headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"id": "narrator", "object": "voice.deleted", "deleted": True}
    # replica A had its tensors cached: it must not serve them any more
    assert httpx.get(replica_a.url + "/v1/audio/voices/narrator", headers=SYNTH).status_code == 404
    r = httpx.post(replica_a.url + "/v1/audio/speech", headers=SYNTH, json={"model": "tts-1", "input": "Hi.",
                                                                            "voice": "narrator"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_voice"
    assert "narrator" not in names(replica_a.url) and "globetrotter" in names(replica_a.url)


def test_the_same_name_registered_on_both_at_once_gives_one_voice(replica_a, replica_b):
    results: dict[str, httpx.Response] = {}
    clips = {"a": wav(8.0, 24000, seed=1), "b": wav(8.0, 24000, seed=2)}

    def go(which: str, url: str) -> None:
        results[which] = register(url, "contested", clips[which], transcript=f"Written through {which}.")

    threads = [threading.Thread(target=go, args=a) for a in (("a", replica_a.url), ("b", replica_b.url))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results.values())
    assert codes == [201, 409], [r.text for r in results.values()]
    winner = next(w for w, r in results.items() if r.status_code == 201)
    for url in (replica_a.url, replica_b.url):
        assert httpx.get(url + "/v1/audio/voices/contested", headers=ADMIN).json()["transcript"] == f"Written through {winner}."


def test_voices_survive_a_restart_and_a_replica_without_registration_serves_them(
        server_process, tmp_path, store, replica_a):
    assert register(replica_a.url, "keeper", wav(4.0), transcript="Keep me.").status_code in (201, 409)
    before = speak(replica_a.url, "keeper", False)
    reader = server_process(tmp_path, "--voice-store-dir", str(store), env={"COSYVOICE_API_KEY": API_KEY}).wait_ready()
    try:
        assert speak(reader.url, "keeper", False) == before
        r = register(reader.url, "newcomer", wav(), headers=SYNTH)
        assert r.status_code == 403 and r.json()["error"]["code"] == "voice_registration_disabled"
        r = httpx.delete(reader.url + "/v1/audio/voices/keeper", headers=SYNTH)
        assert r.status_code == 403 and r.json()["error"]["code"] == "voice_registration_disabled"
    finally:
        reader.stop()


@pytest.mark.parametrize("args, env, says", [
    (["--allow-voice-registration"], {}, "voice registration needs a store"),
    (["--allow-voice-registration", "--voice-store-dir", "{tmp}"], {"COSYVOICE_API_KEY": "k"},
     "needs its own key"),
    (["--voice-store-dir", "{tmp}"], {"COSYVOICE_API_KEY": "k", "COSYVOICE_VOICE_REGISTRATION_KEY": "k"},
     "equals the API key"),
    (["--allow-voice-registration", "--voice-store-dir", "{tmp}"], {"COSYVOICE_VOICE_REGISTRATION_KEY_FILE": "/nonexistent"},
     "Voice registration key file /nonexistent: cannot read it"),
])
def test_registration_settings_that_would_fail_open_stop_the_server(tmp_path, args, env, says):
    cmd = [sys.executable, "-m", "cosyvoice_server.cli", "serve", "--device", "cpu",
           *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 2 and says in out.stderr, out.stderr


async def test_a_voice_registered_on_one_replica_speaks_streamed_text_on_the_other(replica_a, replica_b):
    from cosyvoice_server.client import connect, speak as speak_ws

    r = register(replica_a.url, "agent", wav(4.0, 24000), transcript="I answer as I am written.")
    assert r.status_code == 201, r.text
    pcm = {}
    for voice in ("agent", "default"):
        async with await connect(replica_b.url, api_key=API_KEY, voice=voice, response_format="pcm", seed=4) as s:
            assert s.session["voice"] == voice
            result = await speak_ws(s, ["Streamed text, ", "a cloned voice."])
        assert result.usage["audio_seconds"] > 0.3
        pcm[voice] = result.audio
    assert pcm["agent"] != pcm["default"]  # the session really used the registered voice
