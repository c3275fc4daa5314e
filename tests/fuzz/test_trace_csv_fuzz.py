"""Damaged trace files for ``simulate --trace-file``: each one is replayed or refused with a ValueError
naming the file (the CLI prints it as ``error: ...``), never another exception (a traceback)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cosyvoice_operator.autoscaling import traces
from cosyvoice_operator.autoscaling.simconfig import MAX_TRACE_S
from cosyvoice_operator.autoscaling.simulate import SimConfig, load_profile, make_scaler, simulate

VALID = "t_seconds,rate_rps,mean_audio_s\n" + "".join(f"{60 * i},{2 + i % 3},{6 + i % 5}\n" for i in range(8))
TOKENS = ["nan", "inf", "-inf", "-1", "1e400", "1e9", "0", "", " ", "x", ";", ",", ",,", "\ufeff", "\x00", "#",
          "\r", "\n", "1e-300", "0x10", "١٢", "60", "30", "-60",
          "2026-11-25 10:00:00", "2026-11-25T10:01:00Z", "2026-02-30 10:00", "2026-11-25T10:00:00+25:00", "9999-12-31"]


def damaged(rng: np.random.Generator) -> str:
    rows = [line.split(",") for line in VALID.strip().split("\n")]
    for _ in range(rng.integers(0, 3)):  # a field replaced by a token, or one more column
        row = rows[int(rng.integers(len(rows)))]
        token = TOKENS[rng.integers(len(TOKENS))]
        if rng.integers(4) == 0:
            row.append(token)
        else:
            row[int(rng.integers(len(row)))] = token
    text = list("\n".join(",".join(row) for row in rows) + "\n")
    for _ in range(rng.integers(0, 4)):
        kind = rng.integers(4)
        i = int(rng.integers(len(text) + 1))
        if kind == 0:  # a token inserted
            text[i:i] = list(TOKENS[rng.integers(len(TOKENS))])
        elif kind == 1 and text:  # a character dropped
            del text[min(i, len(text) - 1)]
        elif kind == 2:  # a random printable character
            text[i:i] = [chr(int(rng.integers(32, 127)))]
        else:  # a row duplicated (times no longer increase)
            lines = "".join(text).split("\n")
            j = int(rng.integers(len(lines)))
            text = list("\n".join(lines[:j + 1] + lines[j:]))
    return "".join(text)


@pytest.mark.parametrize("seed", range(4))
def test_damaged_trace_files_are_replayed_or_refused_with_a_message(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cfg = SimConfig()
    prof = load_profile(cfg)
    accepted = refused = 0
    for n in range(150):
        path = tmp_path / f"t{n}.csv"
        path.write_text(damaged(rng), encoding="utf-8")
        try:
            trace = traces.read_csv(path, 12.0)
        except ValueError as exc:
            assert str(path) in str(exc), exc
            refused += 1
            continue
        accepted += 1
        assert 0 < trace.duration <= MAX_TRACE_S
        assert np.isfinite(trace.rate).all() and (trace.rate >= 0).all()
        assert np.isfinite(trace.audio_s).all() and (trace.audio_s > 0).all()
        if trace.duration <= 900 and trace.rate.max() <= 50:  # replays too (a few seconds each)
            result = simulate(trace, make_scaler("hpa", cfg, trace, prof), cfg, 0, prof)
            assert result.gpu_hours > 0
    assert accepted and refused
