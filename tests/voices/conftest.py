"""Servers that register voices, sharing one store directory as replicas share a ReadWriteMany volume."""

from __future__ import annotations

from pathlib import Path

import pytest

from voicekit import registering_server


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def replica_a(server_process, tmp_path_factory, store):
    s = registering_server(server_process, tmp_path_factory.mktemp("a"), store).wait_ready()
    yield s
    s.stop()
