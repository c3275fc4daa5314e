"""Capacity fairness on the WebSocket speech stream: sessions cannot hold the server from HTTP (or the
other way round), an idle clock that blank appends do not restart, a session lifetime, a per-client
cap and a cap on connections that have not sent session.update."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from wskit import SENTENCE, assert_server_healthy, metric, open_raw, send, start, until_closed, wait_for_metric

from cosyvoice_server.api.schemas import SpeechRequest
from cosyvoice_server.api.stream_gate import Connection, Connections, Refusal, client_of
from cosyvoice_server.config import BUNDLED_MODEL, Settings
from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.metrics import Metrics
from cosyvoice_server.scheduling.scheduler import Overloaded, Scheduler, SchedulerConfig, refusal
from cosyvoice_server.state import ServerState

REFUSALS = "cosyvoice_admission_refusals_total"


@pytest.mark.parametrize(("session", "sessions", "requests", "code"), [
    (True, 0, 0, None),
    (True, 5, 2, None),  # 6 of 8 slots may be sessions
    (True, 6, 0, "session_share_full"),  # two slots stay free for HTTP, however idle the sessions are
    (False, 6, 1, None),  # ... and HTTP gets them
    (False, 6, 2, "server_overloaded"),
    (True, 2, 6, "server_overloaded"),
    (False, 0, 7, None),  # nothing is kept for sessions unless configured
])
def test_sessions_cannot_take_the_share_kept_for_http(session, sessions, requests, code) -> None:
    assert refusal(SchedulerConfig(4, 5.0, 4, http_reserved_share=0.25), session, sessions, requests) == code


def test_each_kind_can_be_kept_a_share_and_small_servers_keep_none() -> None:
    both = SchedulerConfig(8, 5.0, 12, http_reserved_share=0.25, stream_reserved_share=0.5)
    assert (both.share(session=True), both.share(session=False)) == (15, 10)
    assert refusal(both, False, 0, 10) == "http_share_full"
    assert refusal(both, True, 15, 0) == "session_share_full"
    assert refusal(both, True, 9, 10) is None
    tiny = SchedulerConfig(1, 5.0, 0, http_reserved_share=0.25)  # a quarter of one slot is none
    assert refusal(tiny, True, 0, 0) is None


def test_the_schedulers_defaults_are_the_servers_settings() -> None:
    assert SchedulerConfig() == SchedulerConfig.from_settings(Settings())
    assert SchedulerConfig().share(session=True) < SchedulerConfig().capacity  # HTTP's share is kept by default


async def test_the_scheduler_counts_sessions_apart_and_says_why_it_refuses() -> None:
    pipeline = Pipeline(BUNDLED_MODEL, "cpu")
    metrics = Metrics()
    state = ServerState(Settings(), metrics, pipeline=pipeline, scheduler=Scheduler(
        pipeline, SchedulerConfig(2, 5.0, 2, http_reserved_share=0.25), metrics))  # stage threads not started
    sched = state.scheduler
    sessions = [state.new_bistream_request() for _ in range(3)]
    for s in sessions:
        sched.submit(s)
    with pytest.raises(Overloaded) as err:
        sched.submit(state.new_bistream_request())
    assert err.value.code == "session_share_full" and "kept for HTTP requests" in str(err.value)
    http = state.new_request(SpeechRequest(model="tts-1", input="Still served."))
    sched.submit(http)  # the slot kept for HTTP
    with pytest.raises(Overloaded) as err:
        sched.submit(state.new_request(SpeechRequest(model="tts-1", input="Now full.")))
    assert err.value.code == "server_overloaded"
    sessions[0].cancel()  # a session leaves: one more session fits again
    sched.submit(state.new_bistream_request())
    samples = {(s.labels["protocol"], s.labels["reason"]): s.value
               for s in metrics.admission_refusals.collect()[0].samples if s.name.endswith("_total")}
    assert samples[("websocket", "session_share_full")] == 1 and samples[("http", "server_overloaded")] == 1


def test_the_connection_ledger_counts_per_client_and_before_session_update() -> None:
    metrics = Metrics()
    ledger = Connections(per_client=2, max_pending=3, metrics=metrics)
    a1, a2 = ledger.admit("addr:a"), ledger.admit("addr:a")
    assert isinstance(a1, Connection) and isinstance(a2, Connection)
    refused = ledger.admit("addr:a")
    assert isinstance(refused, Refusal) and (refused.status, refused.code) == (429, "too_many_sessions")
    b1 = ledger.admit("addr:b")
    full = ledger.admit("addr:c")  # three connections wait for session.update
    assert isinstance(full, Refusal) and full.code == "too_many_connections" and full.headers["Retry-After"]
    a1.session_started()
    a1.session_started()  # once only
    c1 = ledger.admit("addr:c")
    assert isinstance(c1, Connection)
    assert metrics.stream_connections_pending._value.get() == 3
    a2.close()
    a2.close()
    assert isinstance(ledger.admit("addr:a"), Connection)
    for c in (a1, b1, c1):
        c.close()
    assert metrics.stream_connections_pending._value.get() == 1  # the one admitted last is still pending


def test_the_client_is_the_key_when_one_is_in_force_else_the_address() -> None:
    assert client_of(["k1"], "10.0.0.1") == client_of(["k1"], "10.0.0.2")
    assert client_of(["k1"], "10.0.0.1") != client_of(["k2"], "10.0.0.1")
    assert "k1" not in client_of(["k1"], None)
    assert client_of([], "10.0.0.1") != client_of([], "10.0.0.2")


async def test_blank_appends_do_not_keep_a_session_open(start_server) -> None:
    srv = start_server("--stream-idle-timeout-s", "1.5")
    ws = await open_raw(srv.url)
    await start(ws)
    t0 = time.monotonic()

    async def keep_alive_without_text() -> None:
        with contextlib.suppress(ConnectionClosed):
            for text in ["", " ", "\n\t", "...", "", "  "] * 20:
                await send(ws, {"type": "input_text.append", "text": text})
                await send(ws, {"type": "input_text.flush"})  # with nothing to speak
                await asyncio.sleep(0.3)

    sender = asyncio.create_task(keep_alive_without_text())
    events, frames, close = await until_closed(ws, timeout=8)
    sender.cancel()
    assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["idle_timeout"], events
    assert close == 1008 and not frames
    assert 1.4 < time.monotonic() - t0 < 4
    assert "letter or digit" in events[-1]["error"]["message"]
    assert_server_healthy(srv.url)


async def test_a_session_ends_at_its_maximum_duration_even_while_it_speaks(start_server) -> None:
    srv = start_server("--stream-max-session-s", "2.5")
    ws = await open_raw(srv.url)
    created = await start(ws)
    assert created["limits"]["max_session_s"] == 2.5
    t0 = time.monotonic()

    async def talk() -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await send(ws, {"type": "input_text.append", "text": SENTENCE + " "})
                await send(ws, {"type": "input_text.flush"})
                await asyncio.sleep(0.3)

    talker = asyncio.create_task(talk())
    events, frames, close = await until_closed(ws, timeout=10)
    talker.cancel()
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "session_expired", events[-1]
    assert close == 1008 and frames  # it was speaking when its time ran out
    assert 2.4 < time.monotonic() - t0 < 6
    assert_server_healthy(srv.url)
    assert metric(srv.url, "cosyvoice_stream_sessions_total", 'reason="session_expired"') == 1


async def _refused(url: str, **kw) -> tuple[int, dict, dict]:
    with pytest.raises(InvalidStatus) as err:
        await open_raw(url, **kw)
    response = err.value.response
    return response.status_code, json.loads(response.body)["error"], dict(response.headers)


async def test_one_client_cannot_hold_more_than_its_connections(start_server) -> None:
    srv = start_server("--stream-max-sessions-per-client", "2")
    first, second = await open_raw(srv.url), await open_raw(srv.url)
    await start(first)  # a session and a connection still before session.update both count
    status, error, _ = await _refused(srv.url)
    assert (status, error["code"], error["type"]) == (429, "too_many_sessions", "rate_limit_error")
    assert "(2)" in error["message"]
    await first.close()
    assert wait_for_metric(srv.url, "cosyvoice_stream_sessions_open", "", 1) == 1  # the second is still open
    third = await open_raw(srv.url)  # its place is free again
    await start(third)
    for ws in (second, third):
        await ws.close()
    assert metric(srv.url, REFUSALS, 'protocol="websocket",reason="too_many_sessions"') == 1
    assert_server_healthy(srv.url)


async def test_with_keys_in_force_the_cap_is_per_key(start_server, tmp_path) -> None:
    store = tmp_path / "voices"
    store.mkdir()
    srv = start_server("--stream-max-sessions-per-client", "1", "--allow-voice-registration", "--voice-store-dir",
                       str(store), env={"COSYVOICE_API_KEY": "api-key-1", "COSYVOICE_VOICE_REGISTRATION_KEY": "reg-key-2"})
    holder = await open_raw(srv.url, additional_headers={"Authorization": "Bearer api-key-1"})
    status, error, _ = await _refused(srv.url, additional_headers={"Authorization": "Bearer api-key-1"})
    assert (status, error["code"]) == (429, "too_many_sessions")
    other_key = await open_raw(srv.url, additional_headers={"Authorization": "Bearer reg-key-2"})
    await start(other_key)
    # a wrong key is refused as such before it is counted against anyone
    status, error, _ = await _refused(srv.url, additional_headers={"Authorization": "Bearer nope"})
    assert (status, error["code"]) == (401, "invalid_api_key")
    for ws in (holder, other_key):
        await ws.close()


async def test_connections_that_never_send_session_update_are_capped(start_server) -> None:
    srv = start_server("--stream-max-pending-connections", "3", "--stream-max-sessions-per-client", "0")
    waiting = [await open_raw(srv.url) for _ in range(3)]
    assert metric(srv.url, "cosyvoice_stream_connections_pending") == 3
    status, error, headers = await _refused(srv.url)
    assert (status, error["code"]) == (429, "too_many_connections") and headers["retry-after"] == "1"
    await start(waiting[0])  # one becomes a session: a connection may wait again
    late = await open_raw(srv.url)
    await start(late)
    assert metric(srv.url, "cosyvoice_stream_connections_pending") == 2
    for ws in [*waiting, late]:
        await ws.close()
    assert wait_for_metric(srv.url, "cosyvoice_stream_connections_pending", "", 0) == 0
    assert metric(srv.url, REFUSALS, 'protocol="websocket",reason="too_many_connections"') == 1
    assert_server_healthy(srv.url)


async def test_http_requests_cannot_take_the_share_kept_for_sessions(start_server) -> None:
    srv = start_server("--max-batch-size", "1", "--max-queue-size", "1", "--stream-reserved-share", "0.5",
                       "--http-reserved-share", "0")
    ws = await open_raw(srv.url)
    await start(ws)  # the session holds one slot ...
    r = httpx.post(srv.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Fits beside it."}, timeout=60)
    assert r.status_code == 200  # ... HTTP the other
    await ws.close()
    assert wait_for_metric(srv.url, "cosyvoice_inflight_requests", "", 0) == 0

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as client:
            return await client.post(srv.url + "/v1/audio/speech", json={"model": "tts-1", "input": SENTENCE * 3})

    first, second = await asyncio.gather(post(), post())  # only one of two slots may be HTTP's
    refused = [r for r in (first, second) if r.status_code == 429]
    assert len(refused) == 1 and refused[0].json()["error"]["code"] == "http_share_full", (first, second)
    assert "kept for WebSocket sessions" in refused[0].json()["error"]["message"]
    assert metric(srv.url, REFUSALS, 'protocol="http",reason="http_share_full"') == 1


def test_shares_that_keep_more_than_the_whole_capacity_are_refused() -> None:
    with pytest.raises(ValueError, match="at most 1"):
        Settings(http_reserved_share=0.6, stream_reserved_share=0.5)
    with pytest.raises(ValueError, match="null"):
        Settings(stream_allowed_origins="https://a.example, null")
    assert Settings(stream_allowed_origins="HTTPS://A.example:443/").allowed_origins() == {"https://a.example"}
