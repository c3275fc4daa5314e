"""The FastAPI application: probes, metrics and the speech API around one loaded pipeline."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from threadpoolctl import threadpool_limits

from . import __version__, playground
from .api import errors
from .api.auth import require_api_key
from .api.openai import router
from .api.lexicons import router as lexicons_router
from .api.voices import router as voices_router
from .api.speech_stream import router as stream_router
from .api.stream_gate import Connections
from .config import Settings
from .gpu import NVMLCollector
from .keys import RotatingKey
from .metrics import Metrics
from .state import ServerState
from .timeouts import BodyTimeoutMiddleware

log = logging.getLogger(__name__)

BLAS_THREADS = 1


def _rotating(key: str | None, value: str | None, file: Path | None, what: str) -> RotatingKey | None:
    """The key in force, re-read from its file when it came from one (a key given as a value stays)."""
    return None if key is None else RotatingKey(key, None if value is not None else file, what)


def create_app(settings: Settings, on_fatal=None) -> FastAPI:
    """`on_fatal(message)` is called if the model cannot be loaded (the CLI then exits non-zero)."""
    metrics = Metrics()
    metrics.registry.register(NVMLCollector())
    state = ServerState(settings, metrics,
                        api_key=_rotating(settings.resolved_api_key(), settings.api_key, settings.api_key_file,
                                          "API key"),
                        registration_key=_rotating(settings.resolved_registration_key(), settings.voice_registration_key,
                                                   settings.voice_registration_key_file, "Voice registration key"),
                        admin_key=_rotating(settings.resolved_admin_key(), settings.voice_admin_key,
                                            settings.voice_admin_key_file, "Voice admin key"))

    async def load() -> None:
        # numpy's OpenBLAS would run a product on a thread per core and spin them after it, beside the stage
        # threads. The server process makes no BLAS calls on the request path (under load its BLAS thread
        # used no CPU), so one thread changes nothing now and keeps a future call from taking the cores.
        # Voice extraction, which does use BLAS, limits its own workers.
        threadpool_limits(BLAS_THREADS, user_api="blas")
        try:
            await asyncio.to_thread(state.load)
            await state.warm_up()
            state.set_ready(True)
            log.info("ready: serving %s on %s", state.model_id, state.pipeline.runtime.device)
        except Exception as exc:
            state.load_error = f"{exc.__class__.__name__}: {exc}"
            log.error("model load failed: %s", state.load_error)
            if on_fatal:
                on_fatal(state.load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(load())
        watch = asyncio.create_task(_watch_lexicons(state, task))
        yield
        task.cancel()
        watch.cancel()
        if state.scheduler:
            await asyncio.to_thread(state.scheduler.stop)
        if state.extraction:
            state.extraction.close()
        state.close_executors()
        if state.text:
            state.text.close()

    # No trailing-slash redirects: Starlette builds their Location from the client's Host header.
    # The documents are added below, behind the API key.
    app = FastAPI(title="CosyVoice server", version=__version__, lifespan=lifespan, redirect_slashes=False,
                  docs_url=None, redoc_url=None, openapi_url=None,
                  description="OpenAI-compatible text-to-speech for CosyVoice2-style models on ONNX Runtime.")
    app.state.server = state
    app.state.stream_connections = Connections(settings.stream_max_sessions_per_client,
                                               settings.stream_max_pending_connections, metrics)
    errors.install(app)
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=settings.body_timeout_s)
    app.include_router(router)
    app.include_router(voices_router)
    app.include_router(lexicons_router)
    app.include_router(stream_router)
    if settings.docs:
        _add_documents(app)
    if settings.playground:
        playground.install(app)

    @app.get("/healthz", tags=["probes"])
    async def healthz() -> JSONResponse:
        """Liveness: the process answers. Stays 200 while loading and draining."""
        if state.load_error:
            return JSONResponse({"status": "failed", "error": state.load_error}, status_code=500)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", tags=["probes"])
    async def readyz() -> JSONResponse:
        """Readiness: 200 only once the model is loaded and warmed up, 503 while loading or draining, or while voice
        registration is on and no extraction worker can be started."""
        if state.draining:
            return JSONResponse({"status": "draining", "inflight": state.scheduler.inflight}, status_code=503)
        if not state.ready:
            return JSONResponse({"status": "failed" if state.load_error else "loading", "error": state.load_error},
                                status_code=503)
        if state.extraction and (why := state.extraction.unavailable):  # registration is on and cannot work
            return JSONResponse({"status": "degraded", "error": f"no voice extraction worker can start: {why}"},
                                status_code=503)
        return JSONResponse({"status": "ready", "model": state.model_id, "device": state.pipeline.runtime.device,
                             "precision": state.pipeline.precision, "inflight": state.scheduler.inflight})

    for path, probe in (("/healthz", healthz), ("/readyz", readyz)):  # uptime checkers often probe with HEAD
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", tags=["probes"])
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _watch_lexicons(state: ServerState, loaded: asyncio.Task) -> None:
    """Keeps the lexicons current once the model is loaded (the store is created with it)."""
    await asyncio.wait([loaded])
    if state.lexicons is not None and state.settings.lexicon_dir is not None:
        await state.lexicons.watch()


def _add_documents(app: FastAPI) -> None:
    """/openapi.json, /docs and /redoc, guarded like /v1/* (a browser needs the key in a header, so
    with a key set these serve tools such as curl or an API client; `--docs false` turns them off)."""
    guard = [Depends(require_api_key)]

    @app.get("/openapi.json", include_in_schema=False, dependencies=guard)
    async def openapi_document() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=guard)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")

    @app.get("/redoc", include_in_schema=False, dependencies=guard)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")
