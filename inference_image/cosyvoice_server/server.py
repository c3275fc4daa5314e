"""Runs the app under uvicorn with a draining shutdown.

On SIGTERM (what Kubernetes sends after preStop) the server keeps listening but turns /readyz and
new speech requests to 503, lets every accepted request (and voice registration) finish within
`drain_timeout_s`, answers the ones still running then with a 503, and exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import uvicorn

from .app import create_app
from .config import Settings
from .scheduling.request import Outcome
from .timeouts import header_timeout_protocol, websocket_protocol

log = logging.getLogger(__name__)

# After the drain deadline, how long requests still normalising their text get to reach the scheduler and
# be answered 503 (the longest input takes about a second of one worker)
NORMALISING_GRACE_S = 5.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, settings: Settings) -> None:
        super().__init__(config)
        self.settings = settings
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def fatal(self, message: str) -> None:
        self.exit_code = 1
        self.should_exit = True

    def handle_exit(self, sig: int, frame) -> None:
        app_state = _app_state(self)
        if sig not in (signal.SIGTERM, signal.SIGINT) or app_state is None or app_state.draining or not app_state.ready:
            return super().handle_exit(sig, frame)
        app_state.draining = True
        app_state.set_ready(False)
        log.info("signal %s: draining %d accepted request(s), up to %.0f s", signal.Signals(sig).name,
                 app_state.scheduler.inflight, self.settings.drain_timeout_s)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain(app_state)))

    async def _drain(self, app_state) -> None:
        deadline = time.monotonic() + self.settings.drain_timeout_s
        pool = app_state.extraction
        while (not app_state.scheduler.idle() or (pool and pool.busy)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if pool:  # registrations still extracting or waiting for a worker are answered 503 now
            pool.close()
        left = app_state.scheduler.abort_all(Outcome.SHUTDOWN, "the drain timeout passed")
        if left:
            # Their handlers now answer 503 in OpenAI's shape (or end their streams with an error
            # event); those still normalising text do when it is done (at most a second or so). Give
            # them a moment to write it before uvicorn closes the connections.
            log.warning("drain timeout: %d request(s) still in flight get 503", left)
            until = time.monotonic() + NORMALISING_GRACE_S
            while app_state.scheduler.normalising and time.monotonic() < until:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
        else:
            log.info("drained; exiting")
        self.should_exit = True


def _app_state(server: uvicorn.Server):
    app = server.config.app
    return getattr(getattr(app, "state", None), "server", None)


class NoQueryInWebSocketLines(logging.Filter):
    """uvicorn logs each WebSocket handshake's path with its query string at info level, and a client may
    have put its key there (`?api_key=`, refused but logged): the lines keep the path only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and '"WebSocket %s"' in record.msg and isinstance(record.args, tuple):
            record.args = tuple(a.split("?", 1)[0] if isinstance(a, str) and a.startswith("/") else a
                                for a in record.args)
        return True


def run(settings: Settings) -> int:
    holder: dict[str, DrainingServer] = {}
    app = create_app(settings, on_fatal=lambda msg: holder["server"].fatal(msg))
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_graceful_shutdown=5, access_log=False,
                            http=header_timeout_protocol(settings.header_timeout_s),
                            # WebSocket speech sessions: a message over max_body_bytes gets the protocol's
                            # error event (up to this size; beyond it the socket's own 1009 close); audio
                            # does not compress, so no per-message deflate
                            ws=websocket_protocol(5.0, settings.stream_send_buffer_bytes),
                            ws_max_size=16 * settings.max_body_bytes,
                            ws_per_message_deflate=False)
    logging.getLogger("uvicorn.error").addFilter(NoQueryInWebSocketLines())
    server = DrainingServer(config, settings)
    holder["server"] = server
    server.run()
    return server.exit_code
