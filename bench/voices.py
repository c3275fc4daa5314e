"""Does registering voices stall synthesis? Time to first audio of 16 streams while 10 voices are
registered, against the same streams with no registration, side by side in one run.

    .venv/bin/python -m bench.voices --streams 16 --voices 10 --rounds 30 --out docs/bench

One server (registration on, a temporary store) runs a closed loop of `--streams` streamed requests the
whole time, so both phases carry the same synthesis load. Each round is a pair of windows:

- *registering*: `--voices` voices registered one after another from `--clip-s`-second 48 kHz WAV clips
  with a transcript (retried on 429); the window runs from the first upload's start to the last voice's
  201, i.e. exactly while registrations are in flight;
- *idle*: nothing but the streams, as long as the round's registering window (at least `--idle-s`).

The pairs alternate their order (registering then idle, idle then registering, ...), so a neighbour's
load that rises or falls during the run weighs on both phases alike. A request counts in the window it
started in; requests started in the `GAP_S` gaps between windows (long enough for a stream started before
a window to reach its first audio) count in neither.

The voices are uploaded by a separate client process: building and sending multipart bodies in the
streams' event loop would delay that loop's reads and show up as the streams' TTFA, a cost of the load
generator, not of the server. The clips are made before the streams start. Voices are deleted after
the last round.

Reported: each phase's pooled TTFA p50 and p95 and their ratios (the target), each pair's p50 ratio
(the noise), a bootstrap interval over the pairs for the p50 ratio, and the 1-minute load average
before and after (other processes on the machine). Writes `voices.json` to `--out`;
`python -m tools.sync_chart` puts the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import os
import shlex
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

from cosyvoice_server.config import BUNDLED_MODEL

from .loadgen import Result, clients, one
from .report import voices_table
from .run import TEXT, Server, machine

GAP_S = 1.0
BOOTSTRAP = 2000


def clip(seconds: float, rate: int, seed: int) -> bytes:
    """A voiced, syllable-like signal (see tests/voices/clips.py): what the level checks accept as speech."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(120 + 30 * seed % 80 + 25 * np.sin(2 * np.pi * 0.7 * t)) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    audio = 0.25 * voiced * np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5 / np.abs(voiced).max()
    buf = io.BytesIO()
    sf.write(buf, (audio + 0.003 * rng.standard_normal(len(t))).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


# The registering client: its own process (see the module's docstring), with its clips made up front
# (the same clips every round, under new names: each round does the same work).
_clips: list[bytes] = []


def _make_clips(voices: int, seconds: float) -> None:
    _clips[:] = [clip(seconds, 48000, seed=i) for i in range(voices)]


def register_round(url: str, round_: int, text: str) -> tuple[float, float, list[dict]]:
    """Registers round `round_`'s voices one after another: (first upload's start, last answer, per voice)."""
    out = []
    with httpx.Client(base_url=url, timeout=300) as c:
        start = time.perf_counter()  # CLOCK_MONOTONIC: comparable with the streams' timestamps in the parent
        for i, data in enumerate(_clips):
            t0, retries = time.perf_counter(), 0
            while True:
                r = c.post("/v1/audio/voices", data={"name": f"bench-{round_}-{i}", "transcript": text},
                           files={"audio": ("clip.wav", data, "audio/wav")})
                if r.status_code != 429:
                    break
                retries += 1
                time.sleep(float(r.headers.get("retry-after", "1")))
            out.append({"code": r.status_code, "seconds": time.perf_counter() - t0, "retries": retries})
        return start, time.perf_counter(), out


def ttfa_ms(rs: list[Result]) -> np.ndarray:
    return np.array([r.ttfa for r in rs if r.code == 200 and r.ttfa is not None]) * 1000


def summarize(results: list[Result], windows: list[tuple[str, float, float]], seed: int = 0) -> dict:
    """Pooled phases, per-pair ratios and a bootstrap interval over pairs, from windows in pair order."""
    def started_in(w: tuple[str, float, float]) -> list[Result]:
        return [r for r in results if w[1] <= r.start < w[2]]

    pairs = [(a, b) if a[0] == "registering" else (b, a) for a, b in zip(windows[::2], windows[1::2])]
    samples = [(ttfa_ms(started_in(busy)), ttfa_ms(started_in(idle))) for busy, idle in pairs]
    phases: dict[str, dict] = {}
    for j, kind in enumerate(("registering", "idle")):
        mine = [r for p in pairs for r in started_in(p[j])]
        ttfa = ttfa_ms(mine)
        phases[kind] = {"requests": len(mine), "errors": sum(r.code != 200 for r in mine),
                        "window_s": sum(p[j][2] - p[j][1] for p in pairs),
                        "ttfa_p50_ms": float(np.percentile(ttfa, 50)), "ttfa_p95_ms": float(np.percentile(ttfa, 95)),
                        "ttfa_mean_ms": float(ttfa.mean())}
    per_pair = [float(np.median(b) / np.median(i)) for b, i in samples if len(b) and len(i)]
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(BOOTSTRAP):  # pairs drawn with replacement: the spread the rounds' noise allows
        pick = rng.integers(0, len(samples), len(samples))
        busy = np.concatenate([samples[k][0] for k in pick])
        idle = np.concatenate([samples[k][1] for k in pick])
        boot.append(np.median(busy) / np.median(idle))
    return {"phases": {"idle": phases["idle"], "registering": phases["registering"]},
            "p50_ratio_per_round": per_pair,
            "p50_ratio_interval_90": [float(np.percentile(boot, 5)), float(np.percentile(boot, 95))]}


async def experiment(args: argparse.Namespace, url: str) -> dict:
    results: list[Result] = []
    stop = asyncio.Event()
    pool = clients(url, min(8, args.streams))
    loop = asyncio.get_running_loop()
    registrar = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_make_clips,
                                    initargs=(args.voices, args.clip_s))

    async def user(i: int) -> None:
        seed = i * 100_000
        while not stop.is_set():
            results.append(await one(pool[i % len(pool)], args.text, seed, True))
            seed += 1

    async def registering(k: int) -> tuple[str, float, float]:
        start, end, rs = await loop.run_in_executor(registrar, register_round, url, k, args.text)
        registrations.extend(rs)
        return ("registering", start, end)

    async def idle(seconds: float) -> tuple[str, float, float]:
        t0 = time.perf_counter()
        await asyncio.sleep(seconds)
        return ("idle", t0, time.perf_counter())

    try:
        await loop.run_in_executor(registrar, time.sleep, 0)  # the client process is up with its clips
        load_before = os.getloadavg()[0]
        users = [asyncio.create_task(user(i)) for i in range(args.streams)]
        windows: list[tuple[str, float, float]] = []
        registrations: list[dict] = []
        await asyncio.sleep(args.warmup_s)
        last_busy = args.idle_s
        for k in range(args.rounds):
            first_busy = k % 2 == 0  # R I, I R, R I, ...: drift during the run weighs on both phases alike
            if first_busy:
                windows.append(await registering(k))
                last_busy = windows[-1][2] - windows[-1][1]
                await asyncio.sleep(GAP_S)
                windows.append(await idle(max(args.idle_s, last_busy)))
            else:
                windows.append(await idle(max(args.idle_s, last_busy)))
                await asyncio.sleep(GAP_S)
                windows.append(await registering(k))
                last_busy = windows[-1][2] - windows[-1][1]
            await asyncio.sleep(GAP_S)
        stop.set()
        await asyncio.gather(*users)
        load_after = os.getloadavg()[0]
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            for k in range(args.rounds):
                for i in range(args.voices):
                    await c.delete(f"/v1/audio/voices/bench-{k}-{i}")
    finally:
        registrar.shutdown()
        await asyncio.gather(*[c.aclose() for c in pool])

    reg = np.array([r["seconds"] for r in registrations if r["code"] == 201])
    return summarize(results, windows) | {
        "load_avg_1m": [round(load_before, 2), round(load_after, 2)],
        "registrations": {"count": len(registrations), "ok": int(len(reg)),
                          "codes": sorted({r["code"] for r in registrations}),
                          "retries_on_429": sum(r["retries"] for r in registrations),
                          "p50_s": float(np.percentile(reg, 50)) if len(reg) else None,
                          "max_s": float(reg.max()) if len(reg) else None}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=str(BUNDLED_MODEL))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--voices", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=30, help="pairs of windows (registering, idle)")
    ap.add_argument("--clip-s", type=float, default=10.0)
    ap.add_argument("--idle-s", type=float, default=2.0, help="shortest idle window")
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--out", default="docs/bench")
    args = ap.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as store:
        server = Server(Path(args.model_dir), args.device, "--allow-voice-registration", "--voice-store-dir", store)
        try:
            res = asyncio.run(experiment(args, server.url))
        finally:
            server.stop()
    res |= {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": machine(), "device": args.device,
            "streams": args.streams, "voices": args.voices, "rounds": args.rounds, "clip_s": args.clip_s,
            "duration_s": round(time.monotonic() - started),
            "command": "python -m bench.voices " + shlex.join(sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "voices.json").write_text(json.dumps(res, indent=1) + "\n")
    print(voices_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
