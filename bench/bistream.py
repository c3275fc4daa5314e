"""Voice-agent load: text streamed in at an LLM's pace (WebSocket) against the whole text over HTTP.

    .venv/bin/python -m bench.bistream --sessions 1,8,16,32 --rate 25 --duration 40 --out docs/bench

N conversations run at once. In each, an agent's turn is an LLM reply produced at `--rate` tokens
per second (word pieces of at most four characters, about the length of an LLM token of English),
then the reply's audio plays in real time, then the user speaks for `--pause` seconds and the next
turn starts. Two ways to speak a turn, measured one after the other on the same server and text:

* stream: a WebSocket session opened when the turn starts; each token is an input_text.append,
  a flush at the end of each sentence, input_text.end after the last token.
* http: the reply is collected until the LLM is done, then POST /v1/audio/speech (streamed pcm).

Per turn: text-to-first-audio (the first token produced -> the first audio received) and underruns
of a player that starts with the first audio and plays in real time: a chunk that arrives after
the player needed it is a stall (with a 20 ms device buffer of tolerance), and playback resumes
from it. Results: `--out`/bistream.json, bistream.png; docs/benchmarks.md shows them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import httpx
import numpy as np

from cosyvoice_server.client import AudioChunk, StreamError, connect

from .run import Server, machine

REPLY = ("Sure, I can help with that. Your order left our warehouse this morning and should arrive on Thursday. "
         "Would you like me to send the tracking link to your phone?")
PCM_BYTES_PER_S = 48000  # 24 kHz, 16-bit mono
DEVICE_BUFFER_S = 0.02


def llm_tokens(text: str) -> list[str]:
    """Word pieces of at most four characters, each word's leading space on its first piece."""
    out = []
    for word in re.findall(r"\s*\S+", text):
        out += [word[i:i + 4] for i in range(0, len(word), 4)]
    return out


def stalls(arrivals: list[tuple[float, float]], tolerance_s: float = DEVICE_BUFFER_S) -> tuple[int, float]:
    """(stalls, seconds stalled) of a real-time player fed chunks of (arrival time, seconds of audio)
    that starts with the first chunk; after a stall it plays on from the late chunk."""
    if not arrivals:
        return 0, 0.0
    needed = arrivals[0][0]
    count, stalled = 0, 0.0
    for at, seconds in arrivals:
        if at > needed + tolerance_s:
            count += 1
            stalled += at - needed
            needed = at
        needed += seconds
    return count, stalled


@dataclass
class Turn:
    mode: str
    ttfa_s: float | None
    audio_s: float
    stalls: int
    stalled_s: float
    started: float
    error: str | None = None
    chunks: list[tuple[float, float]] = field(default_factory=list, repr=False)

    @property
    def ends_playing(self) -> float:
        return (self.chunks[0][0] if self.chunks else self.started) + max(self.audio_s, 0.0) + self.stalled_s


def _turn(mode: str, started: float, chunks: list[tuple[float, float]], error: str | None = None) -> Turn:
    n, stalled = stalls(chunks)
    return Turn(mode, chunks[0][0] - started if chunks else None, sum(s for _, s in chunks), n, stalled, started,
                error, chunks)


async def stream_turn(url: str, tokens: list[str], rate: float, seed: int) -> Turn:
    """One turn over the WebSocket: tokens appended as the LLM makes them."""
    chunks: list[tuple[float, float]] = []
    try:
        session = await connect(url, response_format="pcm", seed=seed)
    except (StreamError, OSError) as exc:
        return _turn("stream", time.monotonic(), [], f"{type(exc).__name__}: {exc}")
    started = time.monotonic()

    async def feed() -> None:
        for i, tok in enumerate(tokens):
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            await session.append(tok)
            if tok.rstrip().endswith((".", "?", "!")):
                await session.flush()
        await session.end()

    feeder = asyncio.create_task(feed())
    error = None
    try:
        async for event in session:
            if isinstance(event, AudioChunk):
                chunks.append((event.received_at, len(event.data) / PCM_BYTES_PER_S))
    except StreamError as exc:
        error = f"{exc.code}: {exc.message}"
    finally:
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        await session.close()
    return _turn("stream", started, chunks, error)


async def http_turn(client: httpx.AsyncClient, tokens: list[str], rate: float, seed: int) -> Turn:
    """One turn over HTTP: the reply is complete when its last token is made, then it is sent."""
    started = time.monotonic()
    await asyncio.sleep(max(0.0, started + (len(tokens) - 1) / rate - time.monotonic()))
    chunks: list[tuple[float, float]] = []
    body = {"model": "tts-1", "input": "".join(tokens), "response_format": "pcm", "stream": True, "seed": seed}
    try:
        async with client.stream("POST", "/v1/audio/speech", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return _turn("http", started, [], f"HTTP {r.status_code}")
            async for part in r.aiter_raw():
                if part:
                    chunks.append((time.monotonic(), len(part) / PCM_BYTES_PER_S))
    except httpx.HTTPError as exc:
        return _turn("http", started, chunks, f"{type(exc).__name__}: {exc}")
    return _turn("http", started, chunks)


async def conversations(url: str, mode: str, n: int, duration: float, rate: float, pause: float,
                        tokens: list[str]) -> list[Turn]:
    """`n` conversations for `duration` s; turns that start within it are kept (each is waited for)."""
    turns: list[Turn] = []
    stop = time.monotonic() + duration
    client = httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=n + 4))

    async def conversation(i: int) -> None:
        rng = random.Random(i)
        await asyncio.sleep(rng.uniform(0, min(5.0, duration / 4)))  # conversations do not start in lockstep
        k = 0
        while time.monotonic() < stop:
            seed = i * 100_000 + k
            turn = await (stream_turn(url, tokens, rate, seed) if mode == "stream"
                          else http_turn(client, tokens, rate, seed))
            turns.append(turn)
            k += 1
            # the reply plays out, then the user talks
            await asyncio.sleep(max(0.0, turn.ends_playing - time.monotonic()) + pause * rng.uniform(0.5, 1.5))

    try:
        await asyncio.gather(*[conversation(i) for i in range(n)])
    finally:
        await client.aclose()
    return turns


def summarize(turns: list[Turn]) -> dict:
    ok = [t for t in turns if t.error is None and t.ttfa_s is not None]
    ttfa = np.array([t.ttfa_s for t in ok]) * 1000
    pct = lambda q: round(float(np.percentile(ttfa, q)), 1) if len(ttfa) else None  # noqa: E731
    return {
        "turns": len(turns), "errors": len(turns) - len(ok),
        "error_examples": sorted({t.error for t in turns if t.error})[:3],
        "ttfa_p50_ms": pct(50), "ttfa_p95_ms": pct(95), "ttfa_max_ms": pct(100),
        "turns_with_underrun": sum(1 for t in ok if t.stalls),
        "underruns": sum(t.stalls for t in ok), "stalled_s": round(sum(t.stalled_s for t in ok), 3),
        "audio_s": round(sum(t.audio_s for t in ok), 1),
        "first_turn": _first(turns),
    }


def _first(turns: list[Turn]) -> dict | None:
    """The conversation that started first (while the others start and run beside it)."""
    if not turns:
        return None
    t = min(turns, key=lambda x: x.started)
    return {"ttfa_ms": round(t.ttfa_s * 1000, 1) if t.ttfa_s is not None else None, "underruns": t.stalls,
            "stalled_s": round(t.stalled_s, 3), "audio_s": round(t.audio_s, 2), "error": t.error}


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [int(n) for n in res["points"]]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for mode, color in (("stream", "tab:blue"), ("http", "tab:red")):
        rows = [res["points"][str(n)][mode] for n in ns]
        label = "WebSocket, text streamed in" if mode == "stream" else "HTTP, whole text"
        ax[0].plot(ns, [r["ttfa_p50_ms"] for r in rows], "o-", color=color, label=f"{label} p50")
        ax[0].plot(ns, [r["ttfa_p95_ms"] for r in rows], "s--", color=color, label=f"{label} p95")
        ax[1].plot(ns, [100 * r["turns_with_underrun"] / max(1, r["turns"] - r["errors"]) for r in rows], "o-",
                   color=color, label=label)
    ax[0].set_xlabel("concurrent conversations")
    ax[0].set_ylabel("text-to-first-audio (ms)")
    ax[0].set_yscale("log")
    ax[0].legend(fontsize=7)
    ax[1].set_xlabel("concurrent conversations")
    ax[1].set_ylabel("turns with an underrun (%)")
    ax[1].legend(fontsize=7)
    fig.suptitle(f"{res['rate']:g} LLM tokens/s, {res['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


async def main_async(args: argparse.Namespace) -> dict:
    tokens = llm_tokens(args.text)
    server = Server(Path(args.model_dir), args.device, "--max-batch-size", str(args.max_batch_size))
    points: dict[str, dict] = {}
    try:
        for n in [int(x) for x in args.sessions.split(",")]:
            points[str(n)] = {}
            for mode in ("stream", "http"):
                turns = await conversations(server.url, mode, n, args.duration, args.rate, args.pause, tokens)
                points[str(n)][mode] = s = summarize(turns)
                print(f"{n:3d} {mode:6s} turns {s['turns']:4d} errors {s['errors']} TTFA p50 {s['ttfa_p50_ms']} "
                      f"p95 {s['ttfa_p95_ms']} ms, turns with underrun {s['turns_with_underrun']}, "
                      f"first conversation {s['first_turn']}", flush=True)
    finally:
        server.stop()
    return {"date": date.today().isoformat(), "machine": machine(), "device": args.device, "rate": args.rate,
            "tokens": len(tokens), "text": args.text, "duration_s": args.duration, "pause_s": args.pause,
            "max_batch_size": args.max_batch_size, "device_buffer_ms": DEVICE_BUFFER_S * 1000,
            "command": "python -m bench.bistream " + " ".join(args.argv), "points": points}


def main(argv: list[str] | None = None) -> int:
    import sys

    from cosyvoice_server.config import BUNDLED_MODEL

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", default="1,8,16,32", help="concurrent conversations, comma-separated")
    ap.add_argument("--rate", type=float, default=25.0, help="LLM tokens per second")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds in which turns start, per point and mode")
    ap.add_argument("--pause", type=float, default=1.0, help="mean seconds the user speaks between turns")
    ap.add_argument("--text", default=REPLY)
    ap.add_argument("--model-dir", default=str(BUNDLED_MODEL))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--out", default=None, help="directory for bistream.json and bistream.png")
    args = ap.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    res = asyncio.run(main_async(args))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bistream.json").write_text(json.dumps(res, indent=1) + "\n")
        plot(res, out / "bistream.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
