"""Do long inputs hold up other requests? Time to first audio of short streamed requests while other
clients send inputs near the 4096-character limit, for this tree's server and a baseline revision's,
side by side in one run.

    .venv/bin/python -m bench.textload --baseline <git revision> --streams 8 --rounds 4 --seconds 10

Both servers run at once with their defaults (one at a time is loaded). Each round measures, for each
server (the order alternating from round to round, so a neighbour's load that rises or falls weighs on
both alike), two windows of `--seconds`:

- *quiet*: `--streams` clients in a closed loop of streamed requests for a short sentence;
- *long inputs*: the same, plus a long input every `--long-every-s` seconds (4096 characters with
  numbers, dates and times in every sentence: about a second of text normalization on one core) as a
  streamed request whose client reads its first audio and hangs up.

A short request counts in the window it started in, after the window's first second. Reported per
server and window: the short requests' TTFA p50, p95 and p99, and the longest wait between two pieces
of a stream's audio (p99 and max over the requests: a stall a real-time player hears), with this tree's
÷ the baseline's. The baseline
runs from the revision's `inference_image/` (`git archive`) in a temporary directory, with this tree's
virtual environment. Writes `textload.json` to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx
import numpy as np

from cosyvoice_server.api.schemas import MAX_INPUT_CHARS
from cosyvoice_server.config import BUNDLED_MODEL

from .loadgen import body, clients
from .run import TEXT, Server

ROOT = Path(__file__).resolve().parents[1]
LONG = ("In 2024, 3 cats ate 12.5 kg of food on 3/4/2024 at 10:30am. " * 80)[:MAX_INPUT_CHARS]
WARMUP_S = 1.0
WINDOWS = ("quiet", "long inputs")
SERVER_ARGS = ("--max-audio-seconds", "3600")  # room for the long input's audio: it is accepted, not refused


@dataclass
class Short:
    code: int
    start: float
    ttfa: float | None
    gap: float  # the longest wait between two pieces of audio after the first


async def short(client: httpx.AsyncClient, seed: int) -> Short:
    t0 = time.perf_counter()
    ttfa, last, gap = None, None, 0.0
    async with client.stream("POST", "/v1/audio/speech", json=body(TEXT, seed, True)) as r:
        async for part in r.aiter_raw():
            now = time.perf_counter()
            if part and ttfa is None:
                ttfa = now - t0
            elif part:
                gap = max(gap, now - last)
            last = now
    return Short(r.status_code, t0, ttfa, gap)


async def window(url: str, streams: int, long_every: float | None, seconds: float, seed: int) -> tuple[list[Short], int]:
    """The short requests started after the window's first second, and how many long inputs were sent
    (one every `long_every` seconds; None: none)."""
    pool = clients(url, min(8, streams))
    t0 = time.perf_counter()
    stop = t0 + seconds
    results: list[Short] = []

    async def user(i: int) -> None:
        s = seed + i * 100_000
        while time.perf_counter() < stop:
            r = await short(pool[i % len(pool)], s)
            s += 1
            if r.start >= t0 + WARMUP_S:
                results.append(r)

    async def long_input(client: httpx.AsyncClient, k: int) -> None:
        async with client.stream("POST", "/v1/audio/speech", json=body(LONG, seed + k, True)) as r:
            assert r.status_code == 200, (r.status_code, await r.aread())
            async for part in r.aiter_raw():
                if part:
                    break  # the first audio: hang up

    async def long_inputs() -> int:
        if long_every is None:
            return 0
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            tasks = []
            while (due := t0 + len(tasks) * long_every) < stop:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                tasks.append(asyncio.create_task(long_input(client, len(tasks))))
            await asyncio.gather(*tasks)
            return len(tasks)

    try:
        *_, sent = await asyncio.gather(*[user(i) for i in range(streams)], long_inputs())
    finally:
        await asyncio.gather(*[c.aclose() for c in pool])
    return results, sent


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


def summarize(results: list[Short]) -> dict:
    ok = [r for r in results if r.code == 200 and r.ttfa is not None]
    ttfa, gaps = [r.ttfa for r in ok], [r.gap for r in ok]
    return {"requests": len(results), "errors": len(results) - len(ok), "ttfa_p50_ms": _ms(ttfa, 50),
            "ttfa_p95_ms": _ms(ttfa, 95), "ttfa_p99_ms": _ms(ttfa, 99), "gap_p99_ms": _ms(gaps, 99),
            "gap_max_ms": _ms(gaps, 100)}


COLUMNS = {"ttfa_p50_ms": "TTFA p50", "ttfa_p95_ms": "TTFA p95", "ttfa_p99_ms": "TTFA p99",
           "gap_p99_ms": "longest gap p99", "gap_max_ms": "longest gap max"}


def table(res: dict) -> str:
    """Milliseconds; under each baseline row, this tree's with its ratio to the baseline in brackets."""
    rows = ["| window | server | requests (errors) | " + " | ".join(f"{c} ms" for c in COLUMNS.values()) + " |",
            "|---|---|---|" + "---|" * len(COLUMNS)]
    for w in WINDOWS:
        base = res["windows"][w]["baseline"]
        for name in ("baseline", "this tree"):
            r = res["windows"][w][name]
            cells = [f"{r[k]:g}" + (f" ({r[k] / base[k]:.2f} ×)" if name != "baseline" and base[k] else "")
                     if r[k] is not None else "-" for k in COLUMNS]
            rows.append(f"| {w} | {name} | {r['requests']} ({r['errors']}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _baseline_env(tree: Path) -> dict[str, str]:
    """This environment with the baseline's package first on the path, checked to be the one imported."""
    env = os.environ | {"PYTHONPATH": str(tree / "inference_image")}
    where = subprocess.run([sys.executable, "-c", "import cosyvoice_server; print(cosyvoice_server.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).is_relative_to(tree):
        raise RuntimeError(f"the baseline server would import {where}, not the revision's code")
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision to compare with (e.g. main)")
    ap.add_argument("--model-dir", default=str(BUNDLED_MODEL))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--long-every-s", type=float, default=2.0, help="one long input every this many seconds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out", default="docs/bench")
    args = ap.parse_args()

    load_before = os.getloadavg()[0]
    collected = {w: {"baseline": [], "this tree": []} for w in WINDOWS}
    long_sent = {"baseline": 0, "this tree": 0}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.baseline], capture_output=True,
                             text=True, check=True).stdout.strip()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "inference_image"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        servers: dict[str, Server] = {}
        try:
            servers["baseline"] = Server(Path(args.model_dir), args.device, *SERVER_ARGS, env=_baseline_env(tree))
            servers["this tree"] = Server(Path(args.model_dir), args.device, *SERVER_ARGS)
            for k in range(args.rounds):
                order = ["baseline", "this tree"] if k % 2 == 0 else ["this tree", "baseline"]
                for name in order:
                    for w in WINDOWS:
                        every = args.long_every_s if w == "long inputs" else None
                        rs, n = asyncio.run(window(servers[name].url, args.streams, every, args.seconds, k))
                        collected[w][name] += rs
                        long_sent[name] += n
                        print(f"round {k + 1}/{args.rounds} {name:9} {w:11}: {summarize(rs)}", flush=True)
        finally:
            for s in servers.values():
                s.stop()
    res = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "cores": os.cpu_count(), "python": platform.python_version(),
        "baseline": args.baseline, "baseline_commit": rev, "streams": args.streams, "long_every_s": args.long_every_s,
        "rounds": args.rounds, "seconds": args.seconds, "long_inputs_sent": long_sent,
        "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1),
        "command": "python -m bench.textload " + " ".join(sys.argv[1:]),
        "windows": {w: {name: summarize(rs) for name, rs in by.items()} for w, by in collected.items()},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "textload.json").write_text(json.dumps(res, indent=1) + "\n")
    print(table(res))
    print(f"long inputs sent: {long_sent}; 1-minute load average {res['load_before']} before, {res['load_after']} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
