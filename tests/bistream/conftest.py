"""Bistream sessions on the real engine: the bundled tiny model, and the converted miniature checkpoint
(built once per test session by tests/conftest.py) against upstream's classes."""

from __future__ import annotations

import pytest

from cosyvoice_server.config import BUNDLED_MODEL, Settings
from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.metrics import Metrics
from cosyvoice_server.scheduling.scheduler import Scheduler, SchedulerConfig
from cosyvoice_server.state import ServerState


@pytest.fixture(scope="session")
def tiny() -> Pipeline:
    return Pipeline(BUNDLED_MODEL, "cpu")


@pytest.fixture(scope="session")
def mini(converted) -> Pipeline:
    return Pipeline(converted, "cpu", "fp32")


@pytest.fixture
def serve():
    """serve(pipeline, settings={...}, **SchedulerConfig fields) -> a ServerState with its stage threads running."""
    states: list[ServerState] = []

    def start(pipeline: Pipeline, settings: dict | None = None, **config) -> ServerState:
        metrics = Metrics()
        cfg = SchedulerConfig(**{"max_batch_size": 8, "max_queue_delay_ms": 5.0, "max_queue_size": 8, **config})
        state = ServerState(Settings(model_dir=pipeline.model_dir, **(settings or {})), metrics, pipeline=pipeline,
                            scheduler=Scheduler(pipeline, cfg, metrics))
        state.scheduler.start()
        states.append(state)
        return state

    yield start
    for s in states:
        s.scheduler.stop()
