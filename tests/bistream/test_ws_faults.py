"""Bad input and bad clients on the WebSocket speech stream: each gets its error event and close
code, the session ends, and the server stays ready with nothing left behind."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from wskit import SENTENCE, assert_server_healthy, metric, open_raw, send, start, until_closed, wait_for_metric

from cosyvoice_server.api.speech_stream import _Session
from cosyvoice_server.client import StreamError, connect, speak
from cosyvoice_server.client.speech_stream import stream_url

BIG = 65536 + 1  # over the default max_body_bytes


@pytest.mark.parametrize(("frames", "code", "close"), [
    (["this is not json"], "invalid_json", 1008),
    ([{"type": "response.create"}], "unknown_event", 1008),
    ([{"type": "input_text.end"}, {"type": "input_text.append", "text": "late"}], "input_ended", 1008),
    ([{"type": "input_text.append", "text": "x" * BIG}], "message_too_large", 1009),
    ([b"\x00\x01binary"], "binary_not_supported", 1003),
    ([{"type": "session.update", "session": {"voice": "warm"}}], "session_already_started", 1008),
    ([{"type": "input_text.append", "text": 42}], "invalid_value", 1008),
    ([r'{"type": "input_text.append", "text": "hello \ud800 world"}'], "invalid_value", 1008),
])
async def test_each_bad_input_gets_its_error_event_and_close_code(server, frames, code, close) -> None:
    ws = await open_raw(server.url)
    await start(ws)
    if code == "input_ended":  # some text, so the session is still speaking when the late text comes
        await send(ws, {"type": "input_text.append", "text": " ".join([SENTENCE] * 4)})
    for f in frames:
        await send(ws, f)
    events, _, got_close = await until_closed(ws)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1, events
    err = errors[0]["error"]
    assert err["code"] == code and err["type"] == "invalid_request_error" and len(err["message"]) > 20
    assert got_close == close
    assert events[-1]["type"] == "error"  # nothing after the error
    assert_server_healthy(server.url)
    assert metric(server.url, "cosyvoice_stream_sessions_total", f'reason="{code}"') >= 1


async def test_text_before_the_session_options_is_refused(server) -> None:
    ws = await open_raw(server.url)
    await send(ws, {"type": "input_text.append", "text": "hello", "event_id": "ev-1"})
    events, _, close = await until_closed(ws)
    assert [e["error"]["code"] for e in events] == ["session_not_started"] and close == 1008
    assert events[0]["error"]["event_id"] == "ev-1"


async def test_a_message_beyond_the_socket_limit_is_cut_by_the_websocket_layer(server) -> None:
    ws = await open_raw(server.url, max_size=None)
    await start(ws)
    # the server may close on the frame's header, before the client has finished writing its body
    with contextlib.suppress(ConnectionClosed):
        await send(ws, {"type": "input_text.append", "text": "x" * (17 * 65536)})
    _, _, close = await until_closed(ws)
    assert close == 1009
    assert_server_healthy(server.url)


async def test_idle_clients_are_closed_but_slow_writers_and_waiting_for_audio_are_not(start_server) -> None:
    srv = start_server("--stream-idle-timeout-s", "2")
    # nothing at all after connecting
    ws = await open_raw(srv.url)
    t0 = time.monotonic()
    events, _, close = await until_closed(ws)
    assert [e["error"]["code"] for e in events] == ["idle_timeout"] and close == 1008
    assert 1.9 < time.monotonic() - t0 < 6
    # a writer slower than the audio but never silent for the timeout completes
    async with await connect(srv.url) as s:
        async def trickle():
            for w in ["Slow", " but", " steady", " text", " keeps", " the", " session."]:
                yield w
                await asyncio.sleep(0.7)
        result = await speak(s, trickle())
    assert result.usage["input_characters"] == len("Slow but steady text keeps the session.")
    # text flushed, then silence: the segment's audio all arrives first, then the idle close
    ws = await open_raw(srv.url)
    await start(ws)
    await send(ws, {"type": "input_text.append", "text": SENTENCE})
    await send(ws, {"type": "input_text.flush"})
    events, frames, close = await until_closed(ws)
    assert [e["type"] for e in events] == ["speech.segment.done", "error"], events
    assert events[-1]["error"]["code"] == "idle_timeout" and close == 1008
    assert len(b"".join(frames)) == pytest.approx(events[0]["usage"]["audio_seconds"] * 48000, abs=48)
    assert_server_healthy(srv.url)


def _small_window_socket(port: int) -> socket.socket:
    """A client socket with a tiny receive buffer: once it stops reading, the server's writes stall."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return sock


async def _stop_reading(srv) -> ClientConnection:
    """A session of a minute of audio whose client reads nothing after session.created."""
    # max_queue=1: the client library stops reading the socket as soon as one message waits for us
    ws = await open_raw(srv.url, sock=_small_window_socket(srv.port), max_queue=1)
    await start(ws)
    await send(ws, {"type": "input_text.append", "text": " ".join([SENTENCE] * 30)})
    await send(ws, {"type": "input_text.end"})
    return ws


def _kernel_send_queue(server_port: int, client_port: int) -> int:
    """Bytes the server's kernel holds for this client (its socket's tx_queue in /proc/net/tcp)."""
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = row.split()
        if int(f[1].split(":")[1], 16) == server_port and int(f[2].split(":")[1], 16) == client_port:
            return int(f[4].split(":")[0], 16)
    return 0


def _slow_consumers(url: str) -> float:
    return metric(url, "cosyvoice_stream_sessions_total", 'reason="slow_consumer"')


async def test_a_client_that_stops_reading_never_grows_server_memory(start_server) -> None:
    bound = 524288  # ≈ 11 s of 24 kHz PCM, of the minute the text makes
    srv = start_server("--stream-send-buffer-bytes", str(bound), "--stream-send-timeout-s", "120")
    ws = await _stop_reading(srv)
    client_port = ws.local_address[1]
    held, kernel, deadline = [], [], time.monotonic() + 60
    while _slow_consumers(srv.url) < 1:  # the bytes bound ends it: the send timeout is far off
        assert time.monotonic() < deadline, "the session of a client that does not read was never closed"
        # what the process holds for the client (its queue and the connection's write buffer) and the kernel
        held.append(metric(srv.url, "cosyvoice_stream_send_buffer_bytes"))
        kernel.append(_kernel_send_queue(srv.port, client_port))
        await asyncio.sleep(0.05)
    # Measured while it stalled (the write buffer is over its 64 KiB high-water mark before the session
    # ends), never more than the bound plus the vocoder chunk that crossed it (a few seconds of audio):
    # the text's whole audio, 2.9 MB, was never held. The kernel holds at most half the bound.
    assert 65536 < max(held) <= bound + 5 * 48000, held
    assert 0 < max(kernel) <= bound // 2, kernel
    assert_server_healthy(srv.url)


@pytest.mark.parametrize("flags", [
    # more audio waits than the bound allows
    ("--stream-send-buffer-bytes", "32768"),
    # the text's audio fits the bound, but the client takes none of it for the send timeout
    ("--stream-send-buffer-bytes", str(64 << 20), "--stream-send-timeout-s", "2"),
], ids=["send_buffer_bytes", "send_timeout"])
async def test_a_client_that_stops_reading_is_closed(start_server, flags) -> None:
    srv = start_server(*flags)
    ws = await _stop_reading(srv)
    deadline = time.monotonic() + 60
    while _slow_consumers(srv.url) < 1:
        assert time.monotonic() < deadline, "the session of a client that does not read was never closed"
        await asyncio.sleep(0.05)
    # its scheduler request, parked KV cache, queue and buffers are all gone; the server stays ready
    assert_server_healthy(srv.url)
    assert metric(srv.url, "cosyvoice_stream_parked_kv_bytes") == 0
    # the connection was dropped with all that was buffered for it, though the client never read again
    with pytest.raises(ConnectionClosed):
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    # a client that reads is served beside it (opus: its chunks stay below even the smaller bound)
    async with await connect(srv.url, response_format="opus") as s:
        assert (await speak(s, [SENTENCE])).audio
    assert _slow_consumers(srv.url) == 1


async def test_a_receiver_cancelled_as_a_message_arrives_stops() -> None:
    """The session ends by cancelling its receiver; a client message completing in that same loop turn must
    not swallow the cancel (asyncio.wait_for on Python 3.11 did: the session then never ended)."""
    messages: asyncio.Queue = asyncio.Queue()
    session = _Session(SimpleNamespace(scope={}, receive=messages.get),
                       SimpleNamespace(metrics=None, settings=SimpleNamespace(max_body_bytes=65536)))
    receiving = asyncio.create_task(session._next_event(timeout=10))
    await asyncio.sleep(0)  # it waits for a message
    messages.put_nowait({"type": "websocket.receive", "text": json.dumps({"type": "input_text.end"})})
    receiving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await receiving


async def test_admission_full_is_a_retry_later_error(start_server) -> None:
    srv = start_server("--max-batch-size", "1", "--max-queue-size", "0")
    holder = await connect(srv.url)
    with pytest.raises(StreamError) as err:
        await connect(srv.url)
    e = err.value
    assert (e.code, e.type, e.close_code) == ("server_overloaded", "rate_limit_error", 1013)
    assert "retry after" in e.message
    # HTTP requests count against the same admission
    r = httpx.post(srv.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Full."}, timeout=30)
    assert r.status_code == 429
    await holder.close()
    assert wait_for_metric(srv.url, "cosyvoice_inflight_requests", "", 0) == 0
    async with await connect(srv.url) as s:  # the slot is free again
        assert (await speak(s, [SENTENCE])).audio


async def test_draining_refuses_new_sessions_lets_open_ones_finish_and_ends_the_rest(start_server) -> None:
    srv = start_server("--drain-timeout-s", "4")
    finishing = await connect(srv.url, seed=2)
    silent = await connect(srv.url)
    await finishing.append(SENTENCE)
    srv.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while httpx.get(srv.url + "/readyz", timeout=5).status_code != 503:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    with pytest.raises(StreamError) as err:
        await connect(srv.url)
    assert (err.value.code, err.value.close_code) == ("shutting_down", 1001)
    result = await speak(finishing, [" It still finishes."])
    assert result.usage["input_characters"] == len(SENTENCE + " It still finishes.")
    with pytest.raises(StreamError) as err:  # the drain deadline ends the session that never spoke
        async for _ in silent:
            pass
    assert (err.value.code, err.value.close_code) == ("shutting_down", 1001)
    assert srv.proc.wait(20) == 0


def _key_protocol(key: str) -> str:
    return "cosyvoice.key." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


async def test_api_key_by_header_or_browser_subprotocol_fails_closed(start_server) -> None:
    key = "k3y/with+odd=chars"
    srv = start_server(env={"COSYVOICE_API_KEY": key})
    for kw in ({}, {"additional_headers": {"Authorization": "Bearer nope"}},
               {"subprotocols": ["cosyvoice.speech.v1", _key_protocol("nope")]}):
        with pytest.raises(InvalidStatus) as err:
            await open_raw(srv.url, **kw)
        response = err.value.response
        assert response.status_code == 401
        assert json.loads(response.body)["error"]["code"] == "invalid_api_key"
    async with await connect(srv.url, api_key=key) as s:
        assert (await speak(s, [SENTENCE])).audio
    # what a browser does: the key in a second subprotocol; the server answers with the protocol only
    ws = await open_raw(srv.url, subprotocols=["cosyvoice.speech.v1", _key_protocol(key)])
    assert ws.subprotocol == "cosyvoice.speech.v1"
    await start(ws)
    await ws.close()
    assert metric(srv.url, "cosyvoice_stream_sessions_total", 'reason="invalid_api_key"') == 3


async def test_every_credential_presented_counts_and_none_reaches_the_log(start_server, tmp_path) -> None:
    """A right key beside a wrong one (a second Authorization header, a second subprotocol line) is
    refused; the registration key may stream, as it may synthesize over HTTP; at debug level the
    handshake's headers are not logged, and a key put in the query string is not either."""
    store = tmp_path / "voices"
    store.mkdir()
    srv = start_server("--log-level", "debug", "--allow-voice-registration", "--voice-store-dir", str(store),
                       env={"COSYVOICE_API_KEY": "api-key-1", "COSYVOICE_VOICE_REGISTRATION_KEY": "reg-key-2"})
    for kw in ({"additional_headers": [("Authorization", "Bearer api-key-1"), ("Authorization", "Bearer no")]},
               {"additional_headers": [("Authorization", "Bearer api-key-1"),
                                       ("Sec-WebSocket-Protocol", _key_protocol("no"))]}):
        with pytest.raises(InvalidStatus) as err:
            await open_raw(srv.url, **kw)
        assert err.value.response.status_code == 401
    with pytest.raises(InvalidStatus):
        await ws_connect(stream_url(srv.url) + "?api_key=api-key-1", open_timeout=10)
    async with await connect(srv.url, api_key="reg-key-2") as s:
        assert (await speak(s, [SENTENCE])).audio
    log = srv.log()
    assert "api-key-1" not in log and "reg-key-2" not in log
    assert base64.b64encode(b"api-key-1").decode().rstrip("=") not in log


async def test_options_the_stream_cannot_honour_are_refused_with_the_reason(server) -> None:
    with pytest.raises(StreamError) as err:
        await connect(server.url, speed=1.5)
    assert (err.value.code, err.value.param) == ("unsupported_parameter", "session.speed")
    assert "1.0" in err.value.message
    with pytest.raises(StreamError) as err:
        await connect(server.url, instructions="Speak like a pirate.")
    assert (err.value.code, err.value.param) == ("unsupported_parameter", "session.instructions")


async def test_text_that_outgrows_the_session_kv_bound_ends_it_with_advice_to_flush(start_server) -> None:
    srv = start_server("--stream-max-kv-mib", "0.5")
    run_on = " ".join(["and then the words keep coming without a sentence end"] * 30)  # one endless sentence
    async with await connect(srv.url) as s:
        with pytest.raises(StreamError) as err:
            await speak(s, [run_on])
    assert (err.value.code, err.value.close_code) == ("segment_too_long", 1008)
    assert "flush" in err.value.message and "KV cache" in err.value.message
    assert_server_healthy(srv.url)
    # text that goes on without flushes but with sentence ends is cut there by the server: it completes
    async with await connect(srv.url) as s:
        result = await speak(s, [SENTENCE + " "] * 12)
    assert len(result.segments) >= 2 and any(x.usage.get("input_characters") for x in result.segments)


async def test_a_session_without_sentence_ends_completes_and_concurrent_http_requests_succeed(start_server, tmp_path):
    import shutil

    import numpy as np

    from cosyvoice_server.config import BUNDLED_MODEL

    model = Path(shutil.copytree(BUNDLED_MODEL, tmp_path / "model"))
    noise = np.load(model / "flow_noise.npy")
    np.save(model / "flow_noise.npy", noise[:, :600])  # a segment's flow run takes at most 300 speech tokens
    # a long flow batch wait: every chunk shares its flow batch with whatever else is in flight
    srv = start_server("--model-dir", str(model), "--max-queue-delay-ms", "200")
    statuses = []

    async def http_until(done: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            while not done.is_set():
                r = await client.post(srv.url + "/v1/audio/speech", json={
                    "model": "tts-1", "input": "A short sentence beside the session.", "response_format": "pcm",
                    "stream": False})
                statuses.append((r.status_code, r.text if r.status_code != 200 else ""))

    done = asyncio.Event()
    http = asyncio.create_task(http_until(done))
    try:
        async with await connect(srv.url) as s:
            result = await speak(s, ["word " * 60])  # 300 text tokens, no sentence end, one append
    finally:
        done.set()
        await http
    assert len(result.segments) > 1  # cut by the server: the client never flushed
    assert result.usage["audio_seconds"] > 0
    assert statuses and all(code == 200 for code, _ in statuses), statuses
    assert "noise buffer" not in srv.log()
    assert_server_healthy(srv.url)


async def test_an_idle_session_flood_never_starves_http(start_server) -> None:
    """The audit's flood: sessions that hold their slots with empty appends. They get no more than their
    share of the admission capacity, HTTP requests are served beside them, and the idle clock, which
    their appends do not restart, ends them."""
    srv = start_server("--max-batch-size", "2", "--max-queue-size", "2", "--stream-idle-timeout-s", "4")
    flood: list[ClientConnection] = []
    with pytest.raises(StreamError) as err:
        for _ in range(5):  # more than the whole capacity (4)
            ws = await open_raw(srv.url)
            await send(ws, {"type": "session.update", "session": {}})
            event = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if event["type"] == "error":
                raise StreamError(event["error"], None)
            flood.append(ws)
    assert err.value.code == "session_share_full" and len(flood) == 3, (err.value.message, len(flood))

    async def empty_appends(ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                for text in ("", " ", "\u200b"):
                    await send(ws, {"type": "input_text.append", "text": text})
                    await asyncio.sleep(0.2)

    senders = [asyncio.create_task(empty_appends(ws)) for ws in flood]
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(srv.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Served anyway."})
    assert r.status_code == 200 and r.content, r.text
    ends = await asyncio.gather(*(until_closed(ws, timeout=15) for ws in flood))
    for task in senders:
        task.cancel()
    assert [events[-1]["error"]["code"] for events, _, _ in ends] == ["idle_timeout"] * 3
    assert metric(srv.url, "cosyvoice_admission_refusals_total", 'protocol="websocket",reason="session_share_full"') == 1
    assert_server_healthy(srv.url)


@pytest.fixture(scope="module")
def origin_server(server_process, tmp_path_factory):
    """A server that lets two browser origins open sessions."""
    srv = server_process(tmp_path_factory.mktemp("origins"), "--stream-allowed-origins",
                         "https://app.example.com, http://localhost:3000").wait_ready()
    yield srv
    srv.stop()


@pytest.mark.parametrize(("origins", "refused"), [
    ([], None),  # not a browser
    (["https://app.example.com"], None),
    (["HTTPS://App.Example.COM"], None),  # scheme and host are case-insensitive
    (["https://app.example.com:443"], None),  # the scheme's default port
    (["http://localhost:3000"], None),
    (["https://app.example.com:8443"], 403),  # another port is another origin
    (["http://app.example.com"], 403),  # another scheme too
    (["http://localhost:3001"], 403),
    (["http://localhost"], 403),
    (["https://app.example.com.evil.example"], 403),
    (["https://evil.example"], 403),
    (["null"], 403),  # sandboxed pages and files
    ([""], 403),
    (["https://app.example.com/path"], 403),
    (["https://app.example.com", "https://app.example.com"], 400),  # no browser sends two: the WebSocket layer refuses
])
async def test_browser_origins_are_accepted_only_when_listed(origin_server, origins, refused) -> None:
    srv = origin_server
    headers = [("Origin", o) for o in origins]
    if refused is None:
        ws = await open_raw(srv.url, additional_headers=headers)
        await start(ws)
        await ws.close()
        return
    with pytest.raises(InvalidStatus) as err:
        await open_raw(srv.url, additional_headers=headers)
    response = err.value.response
    assert response.status_code == refused
    if refused == 403:
        assert json.loads(response.body)["error"]["code"] == "origin_not_allowed"


async def test_by_default_no_browser_origin_may_open_a_session(server) -> None:
    before = metric(server.url, "cosyvoice_admission_refusals_total", 'protocol="websocket",reason="origin_not_allowed"')
    with pytest.raises(InvalidStatus) as err:  # not even the server's own address
        await open_raw(server.url, origin=server.url)
    assert err.value.response.status_code == 403
    ws = await open_raw(server.url)  # a client that sends no Origin
    await start(ws)
    await ws.close()
    assert metric(server.url, "cosyvoice_admission_refusals_total",
                  'protocol="websocket",reason="origin_not_allowed"') == before + 1
