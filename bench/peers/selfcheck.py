"""Starts each peer, checks its audio, and measures it briefly; prints one summary line per peer.

    .venv/bin/python -m bench.peers.selfcheck --concurrency 16 --duration 5 [--with-server]

Checks: a burst of 32 concurrent requests all succeed with non-empty 24 kHz int16 audio of the length the
in-process pipeline gives; the same (text, seed) twice returns identical samples. `--with-server` adds our
server (non-streaming, same batch size and delay) through loadgen for context.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx
import numpy as np

from cosyvoice_server.config import BUNDLED_MODEL

from ..loadgen import Result, closed_loop
from .clients import closed_loop_peer, fetch_audio
from .launch import KINDS, PeerServer, PeerUnavailable

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away."


def stats(rs: list[Result], duration: float) -> dict:
    ok = [r.latency for r in rs if r.code == 200]
    codes: dict[int, int] = {}
    for r in rs:
        codes[r.code] = codes.get(r.code, 0) + 1
    if not ok:
        return {"requests": len(rs), "codes": codes}
    ms = lambda q: round(float(np.percentile(ok, q)) * 1000, 1)  # noqa: E731
    return {"requests": len(rs), "codes": codes, "rps": round(len(ok) / duration, 2),
            "p50_ms": ms(50), "p99_ms": ms(99)}


async def check_audio(kind: str, url: str, expected: dict[int, int]) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        burst = await asyncio.gather(*[fetch_audio(kind, c, TEXT, s) for s in range(32)])
        a = await fetch_audio(kind, c, TEXT, 7)
        b = await fetch_audio(kind, c, TEXT, 7)
    lengths = [len(x) for x in burst]
    return {"burst_ok": len(burst) == 32 and all(x.dtype == np.int16 and len(x) > 0 for x in burst),
            "burst_lengths_match_pipeline": all(len(burst[s]) == n for s, n in expected.items()),
            "audio_s_min_max": [min(lengths) / 24000, max(lengths) / 24000],
            "same_seed_identical": bool(np.array_equal(a, b)), "seed7_samples": len(a)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--model-dir", type=Path, default=BUNDLED_MODEL)
    ap.add_argument("--with-server", action="store_true")
    args = ap.parse_args()

    from cosyvoice_server.engine.pipeline import Pipeline

    from .static_batch import synthesize_batch

    # Reference lengths from the pipeline in this process (length depends on text and seed only).
    p = Pipeline(args.model_dir, "cpu")
    expected = {s: len(w) for s, w in zip((0, 1, 31), synthesize_batch(p, [(TEXT, s) for s in (0, 1, 31)]))}
    del p

    report: dict[str, dict] = {}
    for kind in args.kinds.split(","):
        peer = PeerServer()
        try:
            url = peer.start(kind, args.max_batch_size, args.delay_ms, args.model_dir)
            row = asyncio.run(check_audio(kind, url, expected))
            rs = asyncio.run(closed_loop_peer(kind, url, args.concurrency, args.duration, TEXT))
            row.update(stats(rs, args.duration))
        except PeerUnavailable as exc:
            row = {"unavailable": str(exc)}
        finally:
            peer.stop()
        report[kind] = row
        print(kind, json.dumps(row), flush=True)
    if args.with_server:
        from ..run import Server

        s = Server(args.model_dir, "cpu", "--max-batch-size", str(args.max_batch_size),
                   "--max-queue-delay-ms", str(args.delay_ms))
        try:
            rs = asyncio.run(closed_loop(s.url, args.concurrency, args.duration, TEXT, stream=False))
        finally:
            s.stop()
        report["server"] = stats(rs, args.duration)
        print("server", json.dumps(report["server"]), flush=True)
    ok = all("unavailable" not in r and r.get("burst_ok") and r.get("same_seed_identical") for k, r in report.items()
             if k != "server")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
