"""The OpenAI-compatible API against a real server process."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import sys
import time

import av
import httpx
import numpy as np
import pytest
import soundfile as sf

SENTENCE = "The quick brown fox jumps over the lazy dog."
SAMPLES_PER_TOKEN = 960


def speech(url: str, timeout: float = 60, **body) -> httpx.Response:
    """A whole-file request (stream=false), the response with its headers."""
    body = {"model": "tts-1", "input": SENTENCE, "response_format": "wav", "stream": False} | body
    return httpx.post(url + "/v1/audio/speech", json=body, timeout=timeout)


def test_wav_is_valid_and_as_long_as_its_speech_tokens(server):
    r = speech(server.url, seed=7)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/wav"
    data = r.content
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
    channels, rate, _, _, bits = struct.unpack("<HIIHH", data[22:36])
    assert (channels, rate, bits) == (1, 24000, 16)
    audio, sr = sf.read(io.BytesIO(data), dtype="int16")
    tokens = int(r.headers["x-speech-tokens"])
    # CosyVoice2 bounds the token count by text length (2x..20x the text tokens)
    from cosyvoice_server.config import BUNDLED_MODEL
    from cosyvoice_server.frontend import TextFrontend
    from cosyvoice_server.model.manifest import load_manifest

    text = sum(len(s) for s in TextFrontend.of_model(BUNDLED_MODEL, load_manifest(BUNDLED_MODEL).frontend).segments(SENTENCE))
    assert 2 * text <= tokens <= 20 * text
    assert len(audio) == tokens * SAMPLES_PER_TOKEN
    assert np.abs(audio).max() > 0
    assert float(r.headers["x-audio-duration-seconds"]) == pytest.approx(len(audio) / 24000, abs=1e-3)


def test_same_seed_same_audio_and_different_seed_differs(server):
    a, b, c = (speech(server.url, seed=s, response_format="pcm").content for s in (11, 11, 12))
    assert a == b
    assert a != c


def decode(data: bytes) -> tuple[str, int, np.ndarray]:
    """(container, sample rate, mono samples in the decoder's own format) by FFmpeg's decoders."""
    with av.open(io.BytesIO(data)) as f:
        rate = f.streams.audio[0].rate
        samples = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)])
        return f.format.name, rate, samples


@pytest.mark.parametrize("fmt, container, media_type", [
    ("flac", "FLAC", "audio/flac"), ("mp3", "MP3", "audio/mpeg"), ("opus", "OGG", "audio/ogg"), ("aac", None, "audio/aac"),
])
def test_compressed_formats_decode_to_the_same_length(server, fmt, container, media_type):
    pcm = speech(server.url, seed=3, response_format="pcm").content
    r = speech(server.url, seed=3, response_format=fmt)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media_type and int(r.headers["content-length"]) == len(r.content)
    if container:  # libsndfile reads these, and whole files carry complete headers (lengths, gapless info)
        info = sf.info(io.BytesIO(r.content))
        assert info.format == container and info.samplerate == 24000
        decoded, _ = sf.read(io.BytesIO(r.content))
        assert abs(len(decoded) - len(pcm) // 2) <= 2000 if fmt != "flac" else len(decoded) == len(pcm) // 2
    else:  # AAC in ADTS frames, as OpenAI sends it
        name, rate, decoded = decode(r.content)
        assert name == "aac" and rate == 24000
        # AAC adds its 1024-sample priming and pads the last frame
        assert 0 <= len(decoded) - len(pcm) // 2 <= 2 * 1024 + 1024


def test_pcm_is_headerless_16_bit(server):
    r = speech(server.url, seed=5, response_format="pcm")
    assert r.headers["content-type"] == "audio/pcm"
    assert len(r.content) == int(r.headers["x-speech-tokens"]) * SAMPLES_PER_TOKEN * 2


def test_speed_scales_duration(server):
    normal = speech(server.url, seed=9)
    fast = speech(server.url, seed=9, speed=2.0)
    d0, d1 = (float(r.headers["x-audio-duration-seconds"]) for r in (normal, fast))
    assert d1 == pytest.approx(d0 / 2, rel=0.05)


def test_voices_change_the_audio(server):
    voices = httpx.get(server.url + "/v1/audio/voices").json()
    names = [v["id"] for v in voices["voices"]]
    assert voices["default"] in names and len(names) >= 2
    outs = {v: speech(server.url, seed=1, voice=v, response_format="pcm").content for v in names}
    assert len(set(outs.values())) == len(names)


def test_models_lists_the_served_model(server):
    data = httpx.get(server.url + "/v1/models").json()
    assert data["object"] == "list"
    card = data["data"][0]
    model_id = card["id"]
    assert model_id == "cosyvoice2-tiny"
    # the fields OpenAI's SDKs parse
    assert card["object"] == "model" and isinstance(card["created"], int) and card["owned_by"]
    assert speech(server.url, model=model_id).status_code == 200
    # what a client can rely on, listed rather than learned from a 400: the model takes instructions, with a
    # voice that has prompt speech (the bundled CosyVoice2 model's default voice is an SFT speaker)
    caps = httpx.get(server.url + f"/v1/models/{model_id}").json()["capabilities"]
    assert caps == card["capabilities"]
    assert caps["family"] == "CosyVoice2"
    assert caps["sample_rate"] == 24000 and {"mp3", "opus", "pcm", "wav"} <= set(caps["response_formats"])
    assert caps["stream_formats"] == ["audio", "sse"] and caps["voice_cloning"] is False
    assert caps["instructions"] is True
    r = speech(server.url, instructions="Speak slowly.")
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"
    assert "without prompt speech" in r.json()["error"]["message"]
    assert speech(server.url, instructions="Speak slowly.", voice="warm").status_code == 200


def test_streamed_wav_arrives_in_order_before_synthesis_ends(server):
    text = " ".join([SENTENCE] * 6)
    whole = speech(server.url, seed=21, input=text, response_format="pcm")
    total = int(whole.headers["x-speech-tokens"])
    chunks, times = [], []
    t0 = time.monotonic()
    body = {"model": "tts-1", "input": text, "response_format": "wav", "seed": 21}  # streaming is the default
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["transfer-encoding"] == "chunked" and "content-length" not in r.headers
        for part in r.iter_raw():
            chunks.append(part)
            times.append(time.monotonic() - t0)
    data = b"".join(chunks)
    # streaming WAV header: unknown sizes are 0xFFFFFFFF
    assert data[:4] == b"RIFF" and struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF
    assert data[40:44] == struct.pack("<I", 0xFFFFFFFF)
    pcm = data[44:]
    # Streamed chunks run the flow with chunk masks (as upstream), so the samples differ from the whole
    # file's, but not their number, and the same seed streams the same samples again.
    assert len(pcm) == len(whole.content) == total * SAMPLES_PER_TOKEN * 2
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert b"".join(r.iter_raw())[44:] == pcm
    first_audio = next(t for t, c in zip(times, np.cumsum([len(c) for c in chunks])) if c > 44)
    assert first_audio < 0.5 * times[-1], f"first audio at {first_audio:.3f}s of {times[-1]:.3f}s"


def stream_raw(url: str, **body) -> list[bytes]:
    body = {"model": "tts-1", "input": SENTENCE} | body
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert "content-length" not in r.headers
        return [part for part in r.iter_raw() if part]


@pytest.mark.parametrize("fmt", ["mp3", "aac", "opus", "flac"])
def test_compressed_formats_stream_by_default_and_decode(server, fmt):
    text = " ".join([SENTENCE] * 6)
    # streamed pcm: a streamed response is generated in chunks (upstream's streaming), a whole file in one piece
    pcm = np.frombuffer(b"".join(stream_raw(server.url, seed=8, input=text, response_format="pcm")), "<i2")
    parts = stream_raw(server.url, seed=8, input=text, response_format=fmt)
    assert len(parts) >= 2, "audio must leave in pieces as it is encoded, not as one file at the end"
    _, rate, decoded = decode(b"".join(parts))
    if fmt == "flac":  # lossless: the very samples, though the streamed header cannot carry the length
        assert rate == 24000 and decoded.dtype == np.int16 and np.array_equal(decoded, pcm)
    else:  # encoder delay and last-frame padding add at most a few frames; opus decodes at 48 kHz
        assert 0 <= len(decoded) * 24000 // rate - len(pcm) <= 3 * 1152


def test_openai_voice_names_resolve_through_the_alias_table(server):
    from cosyvoice_server.api.schemas import OPENAI_VOICES

    listing = httpx.get(server.url + "/v1/audio/voices").json()
    target = {a: v["id"] for v in listing["voices"] for a in v["aliases"]}
    assert sorted(target) == sorted(OPENAI_VOICES)
    own = {v: speech(server.url, seed=2, voice=v, response_format="pcm").content for v in set(target.values())}
    for alias, voice in target.items():
        assert speech(server.url, seed=2, voice=alias, response_format="pcm").content == own[voice], alias
    # OpenAI's voice object
    assert speech(server.url, seed=2, voice={"id": "nova"}, response_format="pcm").content == own[target["nova"]]
    assert speech(server.url, seed=2, voice={"id": "warm"}, response_format="pcm").content == own["warm"]


def test_openapi_documents_every_error_in_openai_shape(server):
    import jsonschema

    doc = httpx.get(server.url + "/openapi.json").json()
    speech_op = doc["paths"]["/v1/audio/speech"]["post"]
    assert {"400", "401", "404", "413", "429", "500", "503", "504"} <= set(speech_op["responses"])
    for path in ("/v1/audio/speech", "/v1/audio/voices", "/v1/models"):
        for status, resp in doc["paths"][path][next(iter(doc["paths"][path]))]["responses"].items():
            if status.startswith(("4", "5")):
                assert resp["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert speech_op["requestBody"]["content"]["application/json"]["schema"]["properties"]["stream"]["default"] is True
    # real bodies validate against the documented schemas
    for path, name in (("/v1/models", "ModelList"), ("/v1/audio/voices", "VoiceList")):
        ok = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{name}"}
        jsonschema.validate(httpx.get(server.url + path).json(), ok | {"components": doc["components"]})
    schema = {"$ref": "#/components/schemas/ErrorResponse", "components": doc["components"]}
    for bad in ({"model": "tts-1"}, {"model": "whisper-1", "input": "hi"}, {"model": "tts-1", "input": "hi", "voice": "x"}):
        r = httpx.post(server.url + "/v1/audio/speech", json=bad, timeout=30)
        assert str(r.status_code) in speech_op["responses"]
        jsonschema.validate(r.json(), schema)


def test_server_voice_aliases_add_to_the_model_table(start_server):
    s = start_server("--voice-aliases", "alloy=warm, narrator=bright")
    def pcm(voice: str) -> bytes:
        return speech(s.url, seed=6, voice=voice, response_format="pcm").content
    assert pcm("alloy") == pcm("warm") and pcm("narrator") == pcm("bright") and pcm("nova") == pcm("bright")


@pytest.mark.parametrize("spec, message", [
    ("alloy=nobody", "--voice-aliases: alias 'alloy' points to voice 'nobody', which does not exist"),
    ("warm=bright", "--voice-aliases: alias 'warm' has the name of an existing voice"),
    ("alloy", "voice_aliases: Value error, expected alias=voice pairs"),
])
def test_bad_server_voice_aliases_stop_start_up(spec, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYVOICE_")} | {"COSYVOICE_VOICE_ALIASES": spec}
    r = subprocess.run([sys.executable, "-m", "cosyvoice_server.cli", "serve", "--port", "1"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_sse_stream_has_deltas_then_done_with_usage(server):
    body = {"model": "tts-1", "input": SENTENCE, "response_format": "pcm", "stream_format": "sse", "seed": 4}
    pcm = speech(server.url, seed=4, response_format="pcm", stream=True).content
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] * SAMPLES_PER_TOKEN * 2 == len(pcm)
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == pcm


BAD_REQUESTS = [
    ({"input": SENTENCE}, 400, "model", "missing_required_parameter"),
    ({"model": "tts-1"}, 400, "input", "missing_required_parameter"),
    ({"model": "tts-1", "input": ""}, 400, "input", "invalid_value"),
    ({"model": "tts-1", "input": "   \n\t "}, 400, "input", "invalid_value"),
    ({"model": "tts-1", "input": "\u0007\u0008"}, 400, "input", "invalid_value"),
    ({"model": "tts-1", "input": "\u200b\u200c\u200d\ufeff"}, 400, "input", "invalid_value"),  # zero-width only
    ({"model": "tts-1", "input": "\U0001f642\u200d\U0001f44d!"}, 400, "input", "invalid_value"),  # emoji only
    ({"model": "tts-1", "input": "x" * 4097}, 400, "input", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "voice": "nobody"}, 400, "voice", "invalid_voice"),
    ({"model": "tts-1", "input": "hi", "voice": {"id": "nobody"}}, 400, "voice.id", "invalid_voice"),
    ({"model": "tts-1", "input": "hi", "voice": {"name": "alloy"}}, 400, "voice", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "voice": {"id": "x" * 300}}, 400, "voice.id", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "voice": 7}, 400, "voice", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "response_format": "ogg"}, 400, "response_format", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "stream": False, "stream_format": "sse"}, 400, "stream_format", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "speed": 0.1}, 400, "speed", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "speed": 4.5}, 400, "speed", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "speed": "fast"}, 400, "speed", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "stream_format": "websocket"}, 400, "stream_format", "invalid_value"),
    ({"model": "tts-1", "input": "hi", "instructions": "whisper"}, 400, "instructions", "unsupported_parameter"),
    ({"model": "whisper-1", "input": "hi"}, 404, "model", "model_not_found"),
]


@pytest.mark.parametrize("body, status, param, code", BAD_REQUESTS)
def test_bad_input_gets_a_4xx_in_openai_error_shape(server, body, status, param, code):
    r = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == code
    assert err["type"] == "invalid_request_error" and len(err["message"]) > 10
    assert httpx.get(server.url + "/readyz").status_code == 200


@pytest.mark.parametrize("content, param", [
    (rb'{"model": "tts-1", "voice": "\ud800", "input": "hi"}', "voice"),
    (rb'{"model": "tts-1", "voice": {"id": "\udc00x"}, "input": "hi"}', "voice"),
])
def test_lone_surrogate_escapes_are_a_400_naming_the_field(server, content, param):
    r = httpx.post(server.url + "/v1/audio/speech", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, "invalid_value", "invalid_request_error")


def test_an_error_message_quoting_any_text_still_renders():
    from cosyvoice_server.api.errors import response
    from cosyvoice_server.refusals import UNKNOWN_VOICE

    r = response(UNKNOWN_VOICE(voice="\ud800", available="default", hint=""))
    assert json.loads(r.body)["error"]["message"] == "Unknown voice '\ud800'; available: default."


@pytest.mark.parametrize("content, ctype, code", [
    (b"{not json", "application/json", "invalid_json"),
    (b"[1, 2]", "application/json", "invalid_json"),
    (b"\xff\xfe", "application/json", "invalid_json"),
    (b'{"model": "tts-1", "input": "' + b"a" * 70000 + b'"}', "application/json", "request_too_large"),
])
def test_malformed_or_oversized_bodies(server, content, ctype, code):
    r = httpx.post(server.url + "/v1/audio/speech", content=content, headers={"content-type": ctype}, timeout=30)
    assert 400 <= r.status_code < 500
    assert r.json()["error"]["code"] == code


def test_a_compressed_body_is_refused_by_its_encoding_not_as_bad_json(server):
    import gzip

    body = gzip.compress(json.dumps({"model": "tts-1", "input": "Hi.", "voice": "alloy"}).encode())
    r = httpx.post(server.url + "/v1/audio/speech", content=body,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 415, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_media_type" and "Content-Encoding 'gzip'" in err["message"]


def test_uptime_probes_may_use_head(server):
    for path in ("/healthz", "/readyz", "/v1/models"):
        r = httpx.head(server.url + path)
        assert r.status_code == 200 and r.content == b"", path
        assert r.headers["content-type"] == "application/json"


def test_unknown_route_and_method_use_the_error_shape(server):
    r = httpx.get(server.url + "/v1/audio/speak")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(server.url + "/v1/audio/speech")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_metrics_expose_every_documented_name(server):
    speech(server.url)
    speech(server.url, speed=99)
    text = server.metrics()
    for name in [
        "cosyvoice_request_duration_seconds_bucket", "cosyvoice_time_to_first_audio_seconds_bucket",
        "cosyvoice_queue_wait_seconds_bucket", "cosyvoice_batch_size_bucket", "cosyvoice_requests_total",
        "cosyvoice_inflight_requests", "cosyvoice_queue_depth", "cosyvoice_audio_seconds_total",
        "cosyvoice_stage_compute_seconds_bucket", "cosyvoice_speech_tokens_total", "cosyvoice_ready",
    ]:
        assert name in text, name
    assert 'cosyvoice_requests_total{code="200"}' in text
    assert 'cosyvoice_requests_total{code="400"}' in text
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    assert f'cosyvoice_model_info{{model="{model}",model_version="{model}"}} 1.0' in text  # unversioned: the id


def test_the_model_version_the_operator_sets_names_the_info_metric(start_server):
    s = start_server(env={"COSYVOICE_MODEL_VERSION": "cv3-canary"})
    info = [line for line in s.metrics().splitlines() if line.startswith("cosyvoice_model_info{")]
    assert len(info) == 1 and 'model_version="cv3-canary"' in info[0] and info[0].endswith(" 1.0")
