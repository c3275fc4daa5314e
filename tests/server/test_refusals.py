"""Refusals are data (refusals.py): a code always means one HTTP status, one error type and one WebSocket
close code, and both protocols render a refusal as the same error object."""

from __future__ import annotations

import json

from cosyvoice_server.api import errors
from cosyvoice_server.api.stream_protocol import ProtocolError
from cosyvoice_server.metrics import REFUSAL_REASONS
from cosyvoice_server.refusals import ADMISSION, DRAINING, UNKNOWN_VOICE, table


def test_a_code_means_one_status_one_type_and_one_close_code() -> None:
    seen: dict[str, set[tuple[int, str, int]]] = {}
    for reason in table().values():
        seen.setdefault(reason.code, set()).add((reason.status, reason.type, reason.close_code))
    assert {code: kinds for code, kinds in seen.items() if len(kinds) > 1} == {}


def test_every_row_renders_with_the_fields_its_template_names() -> None:
    for name, reason in table().items():
        refusal = reason(**dict.fromkeys(reason.fields(), 1.5))
        assert "{" not in refusal.message and refusal.code == reason.code, name


def test_the_refusals_the_metrics_count_are_rows_of_the_table() -> None:
    codes = {reason.code for reason in table().values()}
    assert {code for reasons in REFUSAL_REASONS.values() for code in reasons} <= codes


def test_http_and_the_stream_render_one_error_object() -> None:
    refusal = UNKNOWN_VOICE(voice="nobody", available="default", hint="", param="voice.id")
    http = errors.response(refusal)
    event = ProtocolError.of(refusal, "evt_1").event()
    assert event["type"] == "error"
    assert event["error"] == json.loads(http.body)["error"] | {"param": "session.voice.id", "event_id": "evt_1"}
    assert (http.status_code, ProtocolError.of(refusal).close_code) == (400, 1008)


def test_retry_after_comes_with_the_refusals_that_say_retry() -> None:
    assert errors.response(DRAINING()).headers["Retry-After"] == "1"
    full = ADMISSION["server_overloaded"](reason="The server is at capacity.", retry_after_s=3)
    assert (full.status, full.headers["Retry-After"], full.close_code) == (429, "3", 1013)
