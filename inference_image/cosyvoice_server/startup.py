"""How long each phase of a replica's start took: one log line per phase, in one format for the fetch step
and the server, so an SRE (and `bench.startup`) can read a pod's start from its logs, and the server's
phases in `cosyvoice_startup_phase_seconds{phase}`.

    startup phase=session_llm seconds=4.213

The fetch step's phases: `download` (bytes in, SHA-256 checked as they arrive), `unpack`, `cache_verify`
(a node-cache entry's files re-hashed) and `cache_fill` (the model renamed into the node cache). The
server's: `session_<stage>` per ONNX Runtime session of the pipeline, `sessions` (all of them, wall time),
`voices`, `text_workers`, `voice_workers` (when registration is on) and `warmup` (one synthesis).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

LINE = "startup phase={phase} seconds={seconds:.3f}"
LINE_RE = re.compile(r"startup phase=(?P<phase>[a-z_]+) seconds=(?P<seconds>[0-9.]+)")


def parse_lines(text: str) -> dict[str, float]:
    """The phases in a log (the last line wins for a phase that ran twice)."""
    return {m["phase"]: float(m["seconds"]) for m in LINE_RE.finditer(text)}


class Phases:
    """Times named phases; each one ends with a log line (or `emit`) and a call of `record`."""

    def __init__(self, record: Callable[[str, float], None] | None = None,
                 emit: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._record = record
        self._emit = emit or log.info

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = seconds
        self._emit(LINE.format(phase=phase, seconds=seconds))
        if self._record is not None:
            self._record(phase, seconds)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.add(phase, time.perf_counter() - t0)
