"""Does registering voices stall synthesis? Time to first audio of 16 streams while 10 voices are
registered, against the same streams with no registration, side by side in one run.

    .venv/bin/python -m bench.voices --streams 16 --voices 10 --rounds 3 --out docs/bench

One server (registration on, a temporary store) runs a closed loop of `--streams` streamed requests the
whole time. Each round has a *registering* window (`--voices` voices registered one after another from
`--clip-s`-second 48 kHz WAV clips with a transcript, retried on 429; it lasts until the last is stored),
then an *idle* window as long (at least `--idle-s`), in which nothing else happens. A request belongs to
the window it started in; requests started in the 1 s gaps between windows are not counted. The voices
are deleted after each round (outside the windows). Writes `voices.json` to `--out`; `python -m tools.sync_chart` puts the table
into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shlex
import sys
import tempfile
import time
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


async def register_all(url: str, clips: list[bytes], round_: int) -> list[dict]:
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        for i, data in enumerate(clips):
            t0, retries = time.perf_counter(), 0
            while True:
                r = await c.post("/v1/audio/voices", data={"name": f"bench-{round_}-{i}", "transcript": TEXT},
                                 files={"audio": ("clip.wav", data, "audio/wav")})
                if r.status_code != 429:
                    break
                retries += 1
                await asyncio.sleep(float(r.headers.get("retry-after", "1")))
            out.append({"code": r.status_code, "seconds": time.perf_counter() - t0, "retries": retries})
    return out


async def experiment(args: argparse.Namespace, url: str) -> dict:
    results: list[Result] = []
    stop = asyncio.Event()
    pool = clients(url, min(8, args.streams))

    async def user(i: int) -> None:
        seed = i * 100_000
        while not stop.is_set():
            results.append(await one(pool[i % len(pool)], args.text, seed, True))
            seed += 1

    # made before the streams start: generating them in the load generator's loop would delay its streams
    clips = [[clip(args.clip_s, 48000, seed=k * 100 + i) for i in range(args.voices)] for k in range(args.rounds)]
    users = [asyncio.create_task(user(i)) for i in range(args.streams)]
    windows: list[tuple[str, float, float]] = []
    registrations: list[dict] = []
    await asyncio.sleep(args.warmup_s)
    for k in range(args.rounds):
        t0 = time.perf_counter()
        registrations += await register_all(url, clips[k], k)
        windows.append(("registering", t0, time.perf_counter()))
        await asyncio.sleep(GAP_S)
        t0 = time.perf_counter()
        await asyncio.sleep(max(args.idle_s, windows[-1][2] - windows[-1][1]))  # as long as the registering window
        windows.append(("idle", t0, time.perf_counter()))
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            for i in range(args.voices):
                await c.delete(f"/v1/audio/voices/bench-{k}-{i}")
        await asyncio.sleep(GAP_S)
    stop.set()
    await asyncio.gather(*users)
    await asyncio.gather(*[c.aclose() for c in pool])

    def ttfa_ms(rs: list[Result]) -> np.ndarray:
        return np.array([r.ttfa for r in rs if r.code == 200 and r.ttfa is not None]) * 1000

    def started_in(w: tuple[str, float, float]) -> list[Result]:
        return [r for r in results if w[1] <= r.start < w[2]]

    # each round's registering window against the idle window right after it: the spread shows the noise
    per_round = [float(np.median(ttfa_ms(started_in(busy))) / np.median(ttfa_ms(started_in(idle))))
                 for busy, idle in zip(windows[::2], windows[1::2])]
    phases: dict[str, dict] = {}
    for kind in ("idle", "registering"):
        mine = [r for w in windows if w[0] == kind for r in started_in(w)]
        ttfa = ttfa_ms(mine)
        seconds = sum(w[2] - w[1] for w in windows if w[0] == kind)
        phases[kind] = {"requests": len(mine), "errors": sum(r.code != 200 for r in mine), "window_s": seconds,
                        "ttfa_p50_ms": float(np.percentile(ttfa, 50)), "ttfa_p95_ms": float(np.percentile(ttfa, 95)),
                        "ttfa_mean_ms": float(ttfa.mean())}
    reg = np.array([r["seconds"] for r in registrations if r["code"] == 201])
    return {"phases": phases, "p50_ratio_per_round": per_round,
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
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clip-s", type=float, default=10.0)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--out", default="docs/bench")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as store:
        server = Server(Path(args.model_dir), args.device, "--allow-voice-registration", "--voice-store-dir", store)
        try:
            res = asyncio.run(experiment(args, server.url))
        finally:
            server.stop()
    res |= {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": machine(), "device": args.device,
            "streams": args.streams, "voices": args.voices, "rounds": args.rounds, "clip_s": args.clip_s,
            "command": "python -m bench.voices " + shlex.join(sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "voices.json").write_text(json.dumps(res, indent=1) + "\n")
    print(voices_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
