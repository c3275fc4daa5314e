"""Resident memory of a server under a long, varied load: does it level off?

    .venv/bin/python -m bench.soak --model DIR [--minutes 20] [--concurrency 4] [--variant NAME=FLAGS ...]

Each variant (extra `serve` flags; `server=` is the defaults) serves the model in turn and takes a closed
loop of `--concurrency` clients for `--minutes`: short and paragraph-long inputs, streamed and whole,
seeds varying, so every stage sees many shapes (ONNX Runtime's arenas keep blocks per size). RSS is
sampled every `--sample-s`. Reported: RSS when ready, its floor and peak in each quarter of the run (the floor
levels off when nothing leaks), and audio seconds per wall second, so a fix that costs speed shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from .loadgen import clients, one
from .run import free_port
from .vs_upstream.__main__ import SENTENCES, Served

PARAGRAPHS = [" ".join(SENTENCES[i:i + k]) for i, k in ((0, 3), (2, 4), (5, 3))]


async def load(url: str, concurrency: int, seconds: float, sample, every: float) -> tuple[float, int, list]:
    cls = clients(url, 1)
    stop = time.monotonic() + seconds
    audio, done, samples = 0.0, 0, []

    async def user(i: int) -> None:
        nonlocal audio, done
        k = 0
        while time.monotonic() < stop:
            texts = PARAGRAPHS if (i + k) % 4 == 3 else SENTENCES
            r = await one(cls[0], texts[(i * 7 + k) % len(texts)], i * 100_000 + k, stream=(i + k) % 3 != 0)
            audio += r.audio_s if r.code == 200 else 0.0
            done += r.code == 200
            k += 1

    async def sampler() -> None:
        t0 = time.monotonic()
        while time.monotonic() < stop:
            samples.append((round(time.monotonic() - t0, 1), round(sample())))
            await asyncio.sleep(every)

    t0 = time.monotonic()
    await asyncio.gather(sampler(), *[user(i) for i in range(concurrency)])
    wall = time.monotonic() - t0
    await cls[0].aclose()
    return audio / wall, done, samples


def summary(samples: list[tuple[float, int]]) -> dict:
    """Per quarter of the run, the lowest and highest RSS: the lowest is what the process keeps (arenas,
    sessions, kept voices' prompt states), the highest adds what requests hold while they run (streamed
    segments' flow caches, up to --flow-cache-mib). Levelling off: the last quarter's floor is the third's."""
    t = np.array([s[0] for s in samples])
    rss = np.array([s[1] for s in samples])
    q = np.minimum((t / (t[-1] + 1e-9) * 4).astype(int), 3)
    floors = [int(rss[q == i].min()) for i in range(4)]
    return {"rss_mib_floor_per_quarter": floors, "rss_mib_peak_per_quarter": [int(rss[q == i].max()) for i in range(4)],
            "floor_growth_mib_last_quarter": floors[3] - floors[2]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--variant", action="append", default=None, metavar="NAME=FLAGS")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/cosyvoice-soak"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    a.work_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in a.variant or ["server="]:
        name, _, flags = spec.partition("=")
        port = free_port()
        s = Served(name, [sys.executable, "-m", "cosyvoice_server.cli", "serve", "--model-dir", str(a.model),
                          "--device", "cpu", "--port", str(port), "--request-timeout-s", "1800",
                          *shlex.split(flags)], port, a.work_dir / f"{name}.log").wait()
        try:
            ready = s.rss_mib()
            rate, done, samples = asyncio.run(load(s.url, a.concurrency, a.minutes * 60, s.rss_mib, a.sample_s))
            row = {"variant": name, "flags": flags, "requests_ok": done, "audio_s_per_wall_s": round(rate, 4),
                   "rss_mib_ready": round(ready), **summary(samples), "samples": samples}
        finally:
            s.stop()
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "samples"}), flush=True)
    result = {"command": "python -m bench.soak " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
              "machine": f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores",
              "minutes": a.minutes, "concurrency": a.concurrency, "rows": rows}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
