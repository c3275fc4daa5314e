"""Read timeouts that uvicorn lacks: slow clients must not hold connections or request slots.

- Headers: a connection that has not sent a complete request head within `header_timeout_s` of
  connecting (or of starting its next request on a kept-alive connection) is closed. Without it a
  slowloris client holds a socket and a parser per connection for as long as it likes.
- Body: a request whose body has not fully arrived within `body_timeout_s` of its headers gets a 408
  in OpenAI's error shape and the connection is closed.
- WebSocket close: a closing connection whose peer does not read would wait forever for its last
  bytes to drain (asyncio closes gracefully); it is aborted `close_grace_s` after the session ended.
- WebSocket writes: the app sees its connection's write side (SendFlow, in the ASGI scope's extensions)
  so that what the transport and the kernel hold for a peer that does not read counts against the
  app's own bound; the kernel's share is capped (its send buffer otherwise grows to megabytes).
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
import time
from asyncio import TimerHandle
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

from .refusals import BODY_TIMEOUT


def header_timeout_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline for each request head (pass as `Config(http=...)`)."""

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        _head_timer: TimerHandle | None = None

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


SEND_FLOW = "cosyvoice.websocket.send_flow"  # the ASGI scope extension holding a connection's SendFlow


class SendFlow:
    """A WebSocket connection's write side, for the app: uvicorn's `send` only waits (while the transport
    is paused) and says nothing of the bytes the transport already holds for the peer."""

    def __init__(self, protocol: WebSocketsSansIOProtocol) -> None:
        self._protocol = protocol

    def buffered(self) -> int:
        """Bytes written that the peer has not taken: the transport's buffer and the kernel's send queue."""
        transport = self._protocol.transport
        return transport.get_write_buffer_size() + _kernel_send_queue(transport)

    def paused(self) -> bool:
        """The transport is over its high-water mark: the next send waits for the peer to read."""
        return not self._protocol.writable.is_set()

    def abort(self) -> None:
        """Drops the connection and everything buffered for it at once (for a peer that reads nothing)."""
        self._protocol.transport.abort()


def _kernel_send_queue(transport: asyncio.BaseTransport) -> int:
    """Bytes in the socket's kernel send queue, not yet acknowledged by the peer (0 where unknown)."""
    sock = transport.get_extra_info("socket")
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (AttributeError, OSError, ValueError):  # closed, or a platform without TIOCOUTQ for sockets
        return 0


def websocket_protocol(close_grace_s: float, send_buffer_bytes: int) -> type[WebSocketsSansIOProtocol]:
    """uvicorn's WebSocket protocol whose connection is aborted once its session has ended and
    `close_grace_s` has passed (pass as `Config(ws=...)`): what the socket still buffered for a peer
    that stopped reading is dropped instead of held. Its scope carries the connection's SendFlow, and
    the kernel may hold at most half of `send_buffer_bytes` for the peer (Linux doubles SO_SNDBUF)."""

    class AbortingWebSocketProtocol(WebSocketsSansIOProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # at debug level the websockets library logs every handshake header: the API key with them
            self.conn.debug = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes // 4)

        def handle_connect(self, event: Request) -> None:
            super().handle_connect(event)
            # the app's task is created but has not run yet: it sees the extension
            if self.response.status_code == 101:
                self.scope["extensions"][SEND_FLOW] = SendFlow(self)

        async def run_asgi(self) -> None:
            await super().run_asgi()
            # abort() is a no-op on a connection that has closed meanwhile
            self.loop.call_later(close_grace_s, self.transport.abort)

    return AbortingWebSocketProtocol


class BodyTimeoutMiddleware:
    """ASGI middleware: the whole request body must arrive within `timeout_s` of the request head."""

    def __init__(self, app, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = time.monotonic() + self.timeout_s
        body_done = False

        async def timed_receive():
            nonlocal body_done
            if body_done:  # later receives wait for a disconnect, which has no deadline
                return await receive()
            try:  # not asyncio.wait_for, which on Python 3.11 drops a cancel that comes with the message
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                raise BODY_TIMEOUT(limit=self.timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        await self.app(scope, timed_receive, send)
