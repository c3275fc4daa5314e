"""The streamed-text benchmark's measures: LLM-sized tokens, the real-time player's underruns and the
verdict docs/benchmarks.md shows."""
from __future__ import annotations

import pytest

from bench.bistream import llm_tokens, stalls
from bench.report import bistream_section


def test_tokens_are_short_word_pieces_that_rebuild_the_text() -> None:
    text = "Sure, I can help. Tracking-number arrives!"
    tokens = llm_tokens(text)
    assert "".join(tokens) == text
    assert max(map(len, tokens)) <= 4 and tokens[:4] == ["Sure", ",", " I", " can"]  # spaces ride on word starts


@pytest.mark.parametrize(("arrivals", "expected"), [
    ([], (0, 0.0)),
    ([(10.0, 1.0), (10.5, 1.0), (11.9, 1.0)], (0, 0.0)),  # each chunk before the player needs it
    ([(10.0, 1.0), (11.01, 1.0)], (0, 0.0)),  # 10 ms late: within the device buffer
    ([(10.0, 1.0), (11.5, 1.0), (12.4, 1.0)], (1, 0.5)),  # one stall; playback resumes from the late chunk
    ([(10.0, 0.2), (10.5, 0.2), (11.0, 0.2)], (2, 0.6)),
])
def test_a_real_time_player_counts_each_late_chunk_once(arrivals, expected) -> None:
    n, seconds = stalls(arrivals)
    assert n == expected[0] and seconds == pytest.approx(expected[1])


def _point(underruns: int, turns: int = 10, errors: int = 0) -> dict:
    return {"turns": turns, "errors": errors, "ttfa_p50_ms": 200.0, "ttfa_p95_ms": 400.0,
            "turns_with_underrun": underruns, "underruns": underruns, "stalled_s": 0.1 * underruns,
            "first_turn": {"ttfa_ms": 210.0, "underruns": 0, "error": None}}


def _res(stream: dict, rate: float = 25.0) -> dict:
    return {"date": "2026-12-03", "machine": "2 cores", "device": "cpu", "max_batch_size": 16, "rate": rate,
            "tokens": 40, "duration_s": 40, "pause_s": 1, "device_buffer_ms": 20, "text": "Hi.",
            "command": "python -m bench.bistream", "points": {"32": {"stream": stream, "http": _point(0)}}}


def test_the_target_is_held_against_the_first_conversation_and_every_turn() -> None:
    good = bistream_section(_res(_point(0)))
    assert "| yes |" in good and "**no**" not in good
    some = bistream_section(_res(_point(2)))
    assert some.count("| yes |") == 1 and "2 of 10 turns" in some  # the first is fine, not every turn
    assert "not measured" in bistream_section(_res(_point(0), rate=40.0))
