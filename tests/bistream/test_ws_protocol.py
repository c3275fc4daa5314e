"""The WebSocket speech-stream protocol without a server: parsing, ordering rules, the output-rate
check, the resampler and the credential check."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from starlette.datastructures import Headers

from cosyvoice_server.api import stream_protocol as p
from cosyvoice_server.api.speech_stream import authorized
from cosyvoice_server.audio import StreamResampler

LIMIT = 1024


def parse(event) -> p.ClientEvent:
    return p.parse_event(event if isinstance(event, str) else json.dumps(event), LIMIT)


def test_the_four_client_events_parse() -> None:
    first = parse({"type": "session.update", "event_id": "e1",
                   "session": {"voice": {"id": "warm"}, "response_format": "opus", "sample_rate": 48000, "seed": 7}})
    assert isinstance(first, p.SessionUpdate) and first.event_id == "e1"
    assert first.options.voice_id == "warm" and first.options.response_format == "opus" and first.options.seed == 7
    assert parse({"type": "input_text.append", "text": "Hel"}) == p.Append("Hel")
    assert parse({"type": "input_text.flush"}) == p.Flush()
    assert parse({"type": "input_text.end"}) == p.End()


def test_session_defaults_are_pcm_at_the_model_rate_as_binary_frames() -> None:
    o = parse({"type": "session.update"}).options
    assert (o.model, o.voice_id, o.response_format, o.stream_format, o.speed) == (None, None, "pcm", "audio", 1.0)
    assert o.rate(24000) == 24000 and o.refusal(24000) is None


@pytest.mark.parametrize(("raw", "code", "param", "close"), [
    ("not json", "invalid_json", None, p.POLICY_VIOLATION),
    ("[1, 2]", "invalid_json", None, p.POLICY_VIOLATION),
    ("[" * 100_000 + "]" * 100_000, "message_too_large", None, p.MESSAGE_TOO_BIG),
    ({"type": "response.create"}, "unknown_event", "type", p.POLICY_VIOLATION),
    ({"text": "no type"}, "unknown_event", "type", p.POLICY_VIOLATION),
    ({"type": "input_text.append"}, "invalid_value", "text", p.POLICY_VIOLATION),
    ({"type": "input_text.append", "text": 5}, "invalid_value", "text", p.POLICY_VIOLATION),
    ({"type": "input_text.append", "text": "x" * LIMIT}, "message_too_large", None, p.MESSAGE_TOO_BIG),
    ({"type": "input_text.flush", "text": "x"}, "unknown_parameter", "text", p.POLICY_VIOLATION),
    ({"type": "input_text.end", "event_id": 5}, "invalid_value", "event_id", p.POLICY_VIOLATION),
    ({"type": "session.update", "session": []}, "invalid_value", "session", p.POLICY_VIOLATION),
    ({"type": "session.update", "session": {"response_format": "aac"}}, "invalid_value", "session.response_format",
     p.POLICY_VIOLATION),
    ({"type": "session.update", "session": {"speed": 9}}, "invalid_value", "session.speed", p.POLICY_VIOLATION),
    ({"type": "session.update", "session": {"samplerate": 16000}}, "unknown_parameter", "session.samplerate",
     p.POLICY_VIOLATION),
    ({"type": "session.update", "session": {"voice": {"name": "x"}}}, "invalid_value", "session.voice",
     p.POLICY_VIOLATION),
    ({"type": "session.update", "session": {"voice": {"id": "x" * 300}}}, "invalid_value", "session.voice.id",
     p.POLICY_VIOLATION),
    # JSON escapes of lone surrogates: no text a tokenizer takes
    (r'{"type": "input_text.append", "text": "hello \ud800 world"}', "invalid_value", "text", p.POLICY_VIOLATION),
    (r'{"type": "session.update", "session": {"voice": "\udc00"}}', "invalid_value", "session.voice",
     p.POLICY_VIOLATION),
    (r'{"type": "session.update", "session": {"voice": {"id": "a\ud800"}}}', "invalid_value", "session.voice",
     p.POLICY_VIOLATION),
])
def test_bad_events_name_their_code_field_and_close_code(raw, code, param, close) -> None:
    with pytest.raises(p.ProtocolError) as err:
        parse(raw)
    e = err.value
    assert (e.code, e.param, e.close_code) == (code, param, close)
    event = e.event()
    assert event["type"] == "error" and set(event["error"]) == {"message", "type", "param", "code", "event_id"}
    assert event["error"]["message"].endswith(".") and len(event["error"]["message"]) > 20


def test_unknown_event_lists_the_valid_ones_and_echoes_the_event_id() -> None:
    with pytest.raises(p.ProtocolError) as err:
        parse({"type": "input_audio_buffer.append", "event_id": "abc"})
    assert all(kind in err.value.message for kind in p.CLIENT_EVENTS)
    assert err.value.event()["error"]["event_id"] == "abc"


def test_order_session_first_once_and_nothing_after_end() -> None:
    rules = p.SessionRules()
    with pytest.raises(p.ProtocolError, match="first message") as err:
        rules.check(p.Append("early"))
    assert err.value.code == "session_not_started"
    rules.check(p.SessionUpdate(p.SessionOptions()))
    rules.check(p.Append("a"))
    rules.check(p.Flush())
    with pytest.raises(p.ProtocolError) as err:
        rules.check(p.SessionUpdate(p.SessionOptions()))
    assert err.value.code == "session_already_started"
    rules.check(p.End())
    for late in (p.Append("late"), p.Flush(), p.End()):
        with pytest.raises(p.ProtocolError) as err:
            rules.check(late)
        assert err.value.code == "input_ended"


@pytest.mark.parametrize(("fmt", "rate", "ok"), [("pcm", 16000, True), ("wav", 8000, True), ("opus", 48000, True),
                                                 ("opus", 22050, False), ("pcm", 12345, False), ("mp3", 44100, True),
                                                 ("pcm", 0, False)])
def test_output_rate_must_be_one_the_format_carries(fmt, rate, ok) -> None:
    o = p.SessionOptions(response_format=fmt, sample_rate=rate)
    if ok:
        assert o.rate(24000) == rate and o.refusal(24000) is None
    else:
        err = p.ProtocolError.of(o.refusal(24000))
        assert "choose one of" in err.message and (err.code, err.param) == ("invalid_value", "session.sample_rate")


@pytest.mark.parametrize("out_rate", [8000, 16000, 48000])
def test_resampler_keeps_duration_and_pitch_across_chunks(out_rate) -> None:
    sr, f = 24000, 440.0
    tone = np.sin(2 * np.pi * f * np.arange(sr) / sr).astype(np.float32)
    r = StreamResampler(sr, out_rate)
    out = np.concatenate([r.chunk(tone[i:i + 2400]) for i in range(0, sr, 2400)] + [r.close()])
    assert abs(len(out) - out_rate) <= out_rate // 100
    spectrum = np.abs(np.fft.rfft(out[out_rate // 10: out_rate // 10 + out_rate // 2]))
    peak = np.argmax(spectrum) * out_rate / (out_rate // 2)
    assert abs(peak - f) < 5
    assert len(r.chunk(np.zeros(0, np.float32))) == 0


class _WS:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = Headers(headers)


def _key_proto(key: str) -> str:
    return "cosyvoice.key." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


@pytest.mark.parametrize(("headers", "ok"), [
    ({}, False),
    ({"authorization": "Bearer s3cret/+="}, True),
    ({"authorization": "Bearer wrong"}, False),
    ({"authorization": "Basic s3cret/+="}, False),
    ({"sec-websocket-protocol": f"cosyvoice.speech.v1, {_key_proto('s3cret/+=')}"}, True),
    ({"sec-websocket-protocol": f"cosyvoice.speech.v1, {_key_proto('wrong')}"}, False),
    ({"sec-websocket-protocol": "cosyvoice.speech.v1, cosyvoice.key.%%%"}, False),
    ({"sec-websocket-protocol": "cosyvoice.speech.v1"}, False),
    # every credential presented must be right: a right header does not excuse a wrong subprotocol key
    ({"authorization": "Bearer s3cret/+=", "sec-websocket-protocol": _key_proto("wrong")}, False),
])
def test_credentials_fail_closed(headers, ok) -> None:
    assert authorized(_WS(headers), ["s3cret/+="]) is ok
    assert authorized(_WS(headers), ["other", "s3cret/+="]) is ok  # the API key or the registration key
    assert authorized(_WS(headers), []) is True  # no key configured
