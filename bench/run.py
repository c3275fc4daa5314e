"""Side-by-side benchmark in one run: engine limit, server (batched), server (--max-batch-size 1).

    .venv/bin/python -m bench.run --concurrency 1,2,4,8,16,32,64 --duration 5

For each concurrency the three systems are measured back to back (interleaved, so a noisy
neighbour hits all of them alike), with the same model, text and seeds. Results go to
`--out` as results.json, table.md and PNG plots; ratios are what to compare on a shared CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

from cosyvoice_server.config import BUNDLED_MODEL, Settings

from .engine_limit import Engine
from .loadgen import Result, closed_loop, open_loop
from .report import table
from .peers.clients import closed_loop_peer
from .peers.launch import PeerServer, PeerUnavailable

SERVER_DEFAULTS = Settings.model_fields  # the server's own defaults are the benchmark's
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model_dir: Path, device: str, *args: str, env: dict[str, str] | None = None,
                 wait: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "cosyvoice_server.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--model-dir", str(model_dir), "--device", device, "--max-queue-size", "4096",
               "--request-timeout-s", "600", "--log-level", "warning", *args]
        self.proc = subprocess.Popen(cmd, env=env)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {self.proc.args} did not start")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)


def summarize(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.code == 200]
    codes: dict[str, int] = {}
    for r in results:
        codes[str(r.code)] = codes.get(str(r.code), 0) + 1
    if not ok:
        return {"requests": len(results), "codes": codes}
    lat = np.array([r.latency for r in ok])
    ttfa = np.array([r.ttfa for r in ok if r.ttfa is not None])
    audio = np.array([r.audio_s for r in ok])
    pct = lambda a, q: float(np.percentile(a, q) * 1000) if len(a) else None  # noqa: E731
    return {
        "requests": len(results), "codes": codes,
        "rps": len(ok) / duration, "audio_s_per_s": float(audio.sum() / duration),
        "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "p99_ms": pct(lat, 99),
        "ttfa_p50_ms": pct(ttfa, 50), "ttfa_p95_ms": pct(ttfa, 95),
        "rtf": float(np.mean(lat / np.maximum(audio, 1e-9))),
        "ttfa_samples_ms": [float(x * 1000) for x in ttfa],
    }


def machine() -> str:
    import onnxruntime as ort

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}; Python {platform.python_version()}; onnxruntime {ort.__version__}"


async def sweep(args: argparse.Namespace) -> dict:
    model_dir = Path(args.model_dir)
    systems: dict[str, object] = {}
    engine = Engine(model_dir, args.device, args.max_batch_size)
    systems["engine"] = engine
    delay = ("--max-queue-delay-ms", str(args.max_queue_delay_ms))
    servers = {
        "server": Server(model_dir, args.device, "--max-batch-size", str(args.max_batch_size), *delay),
        "server_unbatched": Server(model_dir, args.device, "--max-batch-size", "1", *delay),
    }
    out: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "text": args.text, "device": args.device,
                 "duration_s": args.duration, "max_batch_size": args.max_batch_size, "stream": args.stream,
                 "max_queue_delay_ms": args.max_queue_delay_ms, "closed_loop": {}, "open_loop": {}}
    peers = [k for k in args.peers.split(",") if k]
    out["peers"] = {"kinds": peers, "unavailable": {}}
    try:
        conc = [int(c) for c in args.concurrency.split(",")]
        bar = tqdm(total=len(conc) * (3 + len(peers)) + len(args.rates), desc="benchmark", unit="run")
        for c in conc:
            row = {}
            for name in ("engine", "server", "server_unbatched"):
                bar.set_postfix_str(f"{name} c={c}")
                if name == "engine":
                    rs = await engine.closed_loop(c, args.duration, args.text)
                else:
                    rs = await closed_loop(servers[name].url, c, args.duration, args.text, args.stream)
                row[name] = summarize(rs, args.duration)
                bar.update()
            for kind in peers:
                bar.set_postfix_str(f"{kind} c={c}")
                if kind not in out["peers"]["unavailable"]:
                    peer = PeerServer()  # started per point: an idle LitServe worker polls ~20 % of a core
                    try:
                        url = peer.start(kind, args.max_batch_size, args.max_queue_delay_ms, model_dir)
                        row[kind] = summarize(await closed_loop_peer(kind, url, c, args.duration, args.text), args.duration)
                        if "rps" not in row[kind]:  # no request succeeded: a broken peer, not a slow one
                            raise PeerUnavailable(f"every request failed: {row.pop(kind)['codes']} (see its log)")
                    except PeerUnavailable as exc:
                        out["peers"]["unavailable"][kind] = str(exc)
                    finally:
                        peer.stop()
                bar.update()
            out["closed_loop"][str(c)] = row
        for rate in args.rates:
            bar.set_postfix_str(f"poisson {rate}/s")
            rs = await open_loop(servers["server"].url, rate, args.duration, args.text, args.stream)
            out["open_loop"][str(rate)] = summarize(rs, args.duration)
            bar.update()
        bar.close()
    finally:
        engine.close()
        for s in servers.values():
            s.stop()
    return out


def plots(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [int(c) for c in res["closed_loop"]]
    names = {"engine": "engine limit (no HTTP)", "server": f"server (max batch {res['max_batch_size']})",
             "server_unbatched": "server (max batch 1)"}
    names |= {k: f"{k} (static batch {res['max_batch_size']})" for k in res["peers"]["kinds"]
              if k not in res["peers"]["unavailable"]}
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in names.items():
        pts = [(c, res["closed_loop"][str(c)].get(key, {})) for c in conc]
        pts = [(c, r) for c, r in pts if "rps" in r]
        ax[0].plot([c for c, _ in pts], [r["rps"] for _, r in pts], marker="o", label=label)
        ax[1].plot([c for c, _ in pts], [r["p99_ms"] for _, r in pts], marker="o", label=label)
    for a, title in zip(ax, ("throughput (requests/s)", "p99 latency (ms)")):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent clients")
        a.set_title(title)
        a.grid(alpha=0.3)
    ax[1].set_yscale("log")
    ax[0].legend()
    fig.tight_layout()
    fig.savefig(out / "throughput_p99.png", dpi=110)
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in conc:
        t = sorted(res["closed_loop"][str(c)]["server"]["ttfa_samples_ms"])
        if t:
            ax.plot(t, np.linspace(0, 1, len(t)), label=f"c={c}")
    ax.set_xscale("log")
    ax.set_xlabel("time to first audio (ms), server, streaming" if res["stream"] else "time to first audio (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ttfa_cdf.png", dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=str(BUNDLED_MODEL))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    ap.add_argument("--rates", default="", help="comma-separated Poisson rates (req/s) for the open-loop test")
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per point (after 1 s warm-up)")
    ap.add_argument("--max-batch-size", type=int, default=SERVER_DEFAULTS["max_batch_size"].default)
    ap.add_argument("--max-queue-delay-ms", type=float, default=SERVER_DEFAULTS["max_queue_delay_ms"].default,
                    help="batching delay, the same for our server and the peers")
    ap.add_argument("--peers", default="litserve,pytriton", help="peer servers (install: bash bench/peers/setup.sh); '' for none")
    ap.add_argument("--no-stream", dest="stream", action="store_false", help="whole responses instead of streams")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--out", default="docs/bench")
    args = ap.parse_args()
    args.rates = [float(r) for r in args.rates.split(",") if r]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = asyncio.run(sweep(args))
    res["command"] = " ".join(["python -m bench.run", *sys.argv[1:]])
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "table.md").write_text(table(res))
    plots(res, out)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
