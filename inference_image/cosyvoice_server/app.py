"""The FastAPI application: probes, metrics and the speech API around one loaded pipeline."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import __version__
from .api import errors
from .api.openai import router
from .config import Settings
from .gpu import NVMLCollector
from .metrics import Metrics
from .state import ServerState

log = logging.getLogger(__name__)


def create_app(settings: Settings, on_fatal=None) -> FastAPI:
    """`on_fatal(message)` is called if the model cannot be loaded (the CLI then exits non-zero)."""
    metrics = Metrics()
    metrics.registry.register(NVMLCollector())
    state = ServerState(settings, metrics, api_key=settings.resolved_api_key())

    async def load() -> None:
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
        yield
        task.cancel()
        if state.scheduler:
            await asyncio.to_thread(state.scheduler.stop)

    app = FastAPI(title="CosyVoice server", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible text-to-speech for CosyVoice2-style models on ONNX Runtime.")
    app.state.server = state
    errors.install(app)
    app.include_router(router)

    @app.get("/healthz", tags=["probes"])
    async def healthz() -> JSONResponse:
        """Liveness: the process answers. Stays 200 while loading and draining."""
        if state.load_error:
            return JSONResponse({"status": "failed", "error": state.load_error}, status_code=500)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", tags=["probes"])
    async def readyz() -> JSONResponse:
        """Readiness: 200 only once the model is loaded and warmed up, 503 while loading or draining."""
        if state.draining:
            return JSONResponse({"status": "draining", "inflight": state.scheduler.inflight}, status_code=503)
        if not state.ready:
            return JSONResponse({"status": "failed" if state.load_error else "loading", "error": state.load_error},
                                status_code=503)
        return JSONResponse({"status": "ready", "model": state.model_id, "device": state.pipeline.runtime.device,
                             "precision": state.pipeline.precision, "inflight": state.scheduler.inflight})

    @app.get("/metrics", tags=["probes"])
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
