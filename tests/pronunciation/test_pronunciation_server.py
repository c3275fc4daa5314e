"""Lexicons, SSML and segment timing against a real server, configured as the operator renders the example
service (examples/pronunciation.yaml): its lexicon ConfigMap mounted where the pod mounts it, and updated the
way the kubelet updates it."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from cosyvoice_operator import render
from cosyvoice_operator.spec import parse_spec
from cosyvoice_server.client import SegmentDone, connect, speak
from kubelet import kubelet_write

ROOT = Path(__file__).resolve().parents[2]
RATE = 24000
PHONES = ('<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="x-cmu">'
          '<lexeme><grapheme>Qwen</grapheme><phoneme>CH W EH1 N</phoneme></lexeme></lexicon>')


def _rendered_pod() -> tuple[dict, dict]:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "pronunciation.yaml").read_text()) if d]
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    cr = next(d for d in docs if d["kind"] == "CosyVoiceService")
    out = render.render(render.Owner(cr["metadata"]["name"], "default", uid="u"), parse_spec(cr["spec"]))
    pod = next(o for o in out.objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    return pod, maps


@pytest.fixture(scope="module")
def served(tmp_path_factory, server_process):
    """The server with the rendered pod's lexicon settings; volumes under a temporary root."""
    root = tmp_path_factory.mktemp("pod")
    pod, maps = _rendered_pod()
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    volumes = {v["name"]: v["configMap"] for v in pod["volumes"] if "configMap" in v}
    for mount in container["volumeMounts"]:
        if mount["name"] in volumes:
            assert mount["readOnly"] and "subPath" not in mount  # a subPath mount would never see an update
            cm = volumes[mount["name"]]
            kubelet_write(root / mount["mountPath"].lstrip("/"), {
                item["path"]: maps[cm["name"]]["data"][item["key"]] for item in cm["items"]}, 1)
    lexicon_dir = root / env["COSYVOICE_LEXICON_DIR"].lstrip("/")
    kubelet_write(lexicon_dir / "phones", {"phones.pls": PHONES}, 1)  # a second, not default
    s = server_process(tmp_path_factory.mktemp("log"), env={
        "COSYVOICE_LEXICON_DIR": str(lexicon_dir), "COSYVOICE_DEFAULT_LEXICONS": env["COSYVOICE_DEFAULT_LEXICONS"]}
    ).wait_ready()
    s.lexicon_dir = lexicon_dir
    yield s
    s.stop()


def post(s, timeout: float = 60, **body) -> httpx.Response:
    body = {"model": "tts-1", "response_format": "pcm", "stream": False, "seed": 5} | body
    return httpx.post(s.url + "/v1/audio/speech", json=body, timeout=timeout)


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.int16)


def test_the_lexicons_the_cr_gives_are_listed(served):
    data = httpx.get(served.url + "/v1/audio/lexicons").json()
    assert data["defaults"] == ["brands"]
    assert {(x["id"], x["default"], x["error"]) for x in data["data"]} == {("brands", True, None),
                                                                          ("phones", False, None)}
    caps = httpx.get(served.url + "/v1/models").json()["data"][0]["capabilities"]
    assert caps["phone_alphabets"] == [] and caps["input_formats"] == ["text", "ssml"]


def test_an_alias_says_exactly_its_text_and_a_configmap_change_reaches_the_running_server(served):
    """Same seed, same LLM input ids: the audio is identical to the alias text's, sample for sample."""
    brand = post(served, input="The W3C met.").content
    assert brand == post(served, input="The World Wide Web Consortium met.", lexicons=[]).content
    unchanged = post(served, input="The W3C met.", lexicons=[]).content
    assert unchanged != brand
    assert post(served, input="The W3C met.", lexicons=["brands"]).content == brand
    volume = served.lexicon_dir / "brands"  # the lexicon's volume, named after its ConfigMap
    pls = (volume / "brands.pls").read_text()
    kubelet_write(volume, {"brands.pls": pls.replace("World Wide Web Consortium", "Web Consortium")}, 2)
    deadline = time.monotonic() + 10
    want = post(served, input="The Web Consortium met.", lexicons=[]).content
    while post(served, input="The W3C met.").content != want:
        assert time.monotonic() < deadline, "the changed lexicon did not reach the server"
        time.sleep(0.2)


def test_a_phoneme_rule_on_a_model_without_phones_is_a_clear_400(served):
    r = post(served, input="Ask Qwen.", lexicons=["phones"])
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_pronunciation" and err["param"] == "lexicons"
    assert "lexeme 'Qwen'" in err["message"] and "cannot take 'x-cmu'" in err["message"]
    r = post(served, input="Ask Qwen.", lexicons=["nope"])
    assert r.status_code == 400 and r.json()["error"]["code"] == "lexicon_not_found"
    assert "brands, phones" in r.json()["error"]["message"]


BREAK = '<speak><s>The first sentence is here.</s><break time="700ms"/><s>And a second one.</s></speak>'


def silence_at(audio: np.ndarray, start_s: float, end_s: float) -> float:
    """Seconds of exact digital silence in [start_s, end_s)."""
    part = audio[round(start_s * RATE):round(end_s * RATE)]
    return float(np.sum(part == 0)) / RATE


def test_a_break_is_silence_in_place_in_whole_and_streamed_audio_with_tiling_segments(served):
    whole = post(served, input=BREAK, input_format="ssml", timestamps="segment")
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/json"
    body = whole.json()
    audio = pcm(base64.b64decode(body["audio"]))
    segs = body["segments"]
    assert [s["text"] for s in segs] == ["The first sentence is here.", "", "And a second one."]
    assert segs[0]["start_s"] == 0 and segs[-1]["end_s"] == len(audio) / RATE
    assert all(a["end_s"] == b["start_s"] for a, b in zip(segs, segs[1:]))
    assert sum(s["end_s"] - s["start_s"] for s in segs) == pytest.approx(len(audio) / RATE, abs=1e-9)
    assert segs[1]["end_s"] - segs[1]["start_s"] == pytest.approx(0.7, abs=1 / RATE)
    assert silence_at(audio, segs[1]["start_s"], segs[1]["end_s"]) >= 0.65
    assert np.abs(audio[: round(segs[0]["end_s"] * RATE)]).max() > 0  # speech around it

    with httpx.stream("POST", served.url + "/v1/audio/speech", timeout=60, json={
            "model": "tts-1", "input": BREAK, "input_format": "ssml", "response_format": "pcm", "seed": 5,
            "stream_format": "sse", "timestamps": "segment"}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    streamed = pcm(b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"))
    timed = [e for e in events if e["type"] == "speech.segment"]
    assert kinds[-1] == "speech.audio.done" and kinds.index("speech.segment") < max(
        i for i, k in enumerate(kinds) if k == "speech.audio.delta")  # between the audio deltas
    assert [e["text"] for e in timed] == [s["text"] for s in segs]
    assert sum(e["end_s"] - e["start_s"] for e in timed) == pytest.approx(len(streamed) / RATE, abs=1e-9)
    assert silence_at(streamed, timed[1]["start_s"], timed[1]["end_s"]) >= 0.65
    # a raw audio stream has the silence in place too
    raw = httpx.post(served.url + "/v1/audio/speech", timeout=60, json={
        "model": "tts-1", "input": BREAK, "input_format": "ssml", "response_format": "pcm", "seed": 5}).content
    assert len(pcm(raw)) == len(streamed) and silence_at(pcm(raw), timed[1]["start_s"], timed[1]["end_s"]) >= 0.65


def test_prosody_rate_changes_the_length_of_its_part_only(served):
    r = post(served, input='<speak><s>One two three.</s><prosody rate="50%"><s>One two three.</s></prosody></speak>',
             input_format="ssml", timestamps="segment", seed=9)
    segs = r.json()["segments"]
    (a, b) = [s["end_s"] - s["start_s"] for s in segs]
    assert b == pytest.approx(2 * a, rel=0.1)


@pytest.mark.parametrize("doc, status, code, words", [
    ("<speak>\n<emphasis>hi</emphasis></speak>", 400, "invalid_ssml", ["<emphasis>", "line 2"]),
    ('<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
     '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><speak>&c;</speak>', 400, "invalid_ssml", ["DTD"]),
    ('<!DOCTYPE s [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>', 400, "invalid_ssml", ["DTD"]),
    ("<speak>" + "<s>" * 3000 + "x" + "</s>" * 3000 + "</speak>", 400, "invalid_ssml", ["16 deep"]),
    ("<speak>" + "x " * 5000 + "</speak>", 400, "input_too_long", ["4096"]),
])
def test_bad_and_hostile_ssml_is_refused_without_work(served, doc, status, code, words):
    t0 = time.perf_counter()
    r = post(served, input=doc, input_format="ssml")
    elapsed = time.perf_counter() - t0
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    assert all(w in r.json()["error"]["message"] for w in words)
    assert elapsed < 0.5  # refused before any normalization or synthesis (a request that runs takes seconds)


def test_ten_megabytes_of_nesting_is_refused_at_the_door(served):
    t0 = time.perf_counter()
    r = post(served, input="<speak>" + "<p>" * 3_500_000, input_format="ssml")
    assert r.status_code == 413 and time.perf_counter() - t0 < 2


def test_timestamps_need_somewhere_to_go(served):
    r = httpx.post(served.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "timestamps": "segment"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "timestamps"


async def test_websocket_ssml_breaks_and_segment_times(served):
    stream = await connect(served.url, input_format="ssml", seed=3, lexicons=["brands"])
    result = await speak(stream, ["<speak><s>Hello from the W", "3C.</s><break time=", '"700ms"/><s>Bye now.', "</s></speak>"])
    audio = pcm(result.audio)
    segs: list[SegmentDone] = result.segments
    assert [(s.segment, s.is_break) for s in segs] == [(0, False), (None, True), (1, False)]
    assert segs[0].text.startswith("Hello from the ") and segs[0].text.endswith("Web Consortium.")  # the alias
    assert [s.start_s for s in segs[1:]] == [s.end_s for s in segs[:-1]] and segs[-1].end_s == len(audio) / RATE
    assert silence_at(audio, segs[1].start_s, segs[1].end_s) >= 0.65
    with pytest.raises(Exception, match="not available with streamed text"):
        stream = await connect(served.url, input_format="ssml")
        await speak(stream, ['<speak><prosody rate="slow">x</prosody></speak>'])
