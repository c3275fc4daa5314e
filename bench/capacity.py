"""A replica's capacity profile: throughput and latency against concurrency and request length.

    .venv/bin/python -m bench.capacity --out operator/cosyvoice_operator/autoscaling/profiles/tiny-cpu.json

One real server is started with the batch and queue settings the operator deploys (the defaults of
``spec.batching``), then driven closed-loop at each concurrency with a short and a long text. For
each point the profile keeps completions per second, mean audio seconds per request and latency
percentiles. The autoscaling simulator replays a replica from this file and the policy sizes
replicas from it (``spec.autoscaling.capacityProfile``), so both work from what was measured.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from cosyvoice_operator.spec import Batching
from cosyvoice_server.config import BUNDLED_MODEL

from .loadgen import closed_loop
from .run import Server, machine

TEXTS = {
    "short": "Thanks for calling, how can I help?",
    "long": ("The quick brown fox jumps over the lazy dog, and then it runs away across the wide green field, "
             "past the old stone wall, down to the river where the boats are waiting for the morning tide."),
}


def point(results: list, duration: float, concurrency: int) -> dict:
    ok = [r for r in results if r.code == 200]
    lat = np.array([r.latency for r in ok]) if ok else np.array([float("nan")])
    return {"concurrency": concurrency, "requests": len(ok), "throughput_rps": len(ok) / duration,
            "audio_s": float(np.mean([r.audio_s for r in ok])) if ok else None,
            "latency_mean_ms": float(np.mean(lat) * 1000), "latency_p50_ms": float(np.percentile(lat, 50) * 1000),
            "latency_p95_ms": float(np.percentile(lat, 95) * 1000)}


async def measure(args: argparse.Namespace) -> dict:
    batching = Batching()
    server = Server(Path(args.model_dir), args.device, "--max-batch-size", str(batching.max_batch_size),
                    "--max-queue-delay-ms", str(batching.max_queue_delay_ms))
    out: dict = {"name": args.name, "machine": machine(), "device": args.device, "date": time.strftime("%Y-%m-%d"),
                 "command": "python -m bench.capacity " + " ".join(args.argv),
                 "batching": {"max_batch_size": batching.max_batch_size,
                              "max_queue_delay_ms": batching.max_queue_delay_ms,
                              "max_queue_size": batching.max_queue_size},
                 "lengths": {}}
    try:
        for name, text in TEXTS.items():
            points = []
            for c in [int(x) for x in args.concurrency.split(",")]:
                rs = await closed_loop(server.url, c, args.duration, text, False, warmup=1.0)
                points.append(point(rs, args.duration, c))
                print(json.dumps({"length": name, **points[-1]}), flush=True)
            out["lengths"][name] = points
    finally:
        server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    import sys

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--duration", type=float, default=8.0, help="measured seconds per point")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model-dir", default=str(BUNDLED_MODEL))
    ap.add_argument("--name", default="tiny-cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    profile = asyncio.run(measure(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(profile, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
