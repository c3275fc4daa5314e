"""The server against upstream's own PyTorch inference at the released models' real sizes, in one run.

    .venv/bin/python -m bench.vs_upstream [--work-dir /tmp/cosyvoice-vs-upstream] [--concurrency 1,4,8] [--rounds 1]
    .venv/bin/python -m bench.vs_upstream --family cosyvoice3 --upstream ~/src/CosyVoice   # a git clone of upstream
    make bench-upstream [BENCH_ARGS='--family cosyvoice3 --upstream ~/src/CosyVoice']

It builds the real-size random-weight checkpoint (convert/miniature.py --size full: CosyVoice2-0.5B's sizes
with upstream's classes, or Fun-CosyVoice3-0.5B's with the project's), converts it, and serves the same weights
twice: `cosyvoice-server serve` (each --variant: its extra server flags) and upstream's inference, one model, a
thread per request (upstream_server.py for CosyVoice2, from the `cosyvoice-minicpmo` package;
upstream3_server.py for CosyVoice3, from the checkout given with --upstream, which needs x-transformers). Every concurrency
level runs each system in turn, in an order that alternates per round, with the same sentences and voice:
streamed requests in a closed loop (`--requests` per client), with the model's default voice or, with
`--prompt-seconds`, a zero-shot voice with that much prompt speech (CosyVoice2's usual mode; added to both). Reported per system and level: audio seconds per
wall second, time to first audio p50/p95, latency p50, resident memory, and each stage's compute seconds.
The tokens are sampled (random weights: lengths vary a little between systems); ratios are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from ..loadgen import Result, clients, one
from ..run import free_port

# Random weights stop at the shortest length upstream allows (2 speech tokens per text token), so these
# sentences (24-59 tokens of the miniature's tokenizer, 44 on average) give about 3.5 s of audio each.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog, then runs to the river.",
    "Please call me back when you get this message about the weekend.",
    "The weather today is sunny with a light breeze from the west.",
    "Our meeting has been moved to three o'clock on Thursday afternoon.",
    "She sells sea shells by the sea shore, the finest shells around.",
    "Turn left at the next corner and keep going past the bakery.",
    "The library closes early on Sunday evenings, so return your books.",
    "Thank you for waiting, your order is ready at the front counter.",
]
REPO = Path(__file__).resolve().parents[2]


def build(work: Path, family: str = "cosyvoice2") -> tuple[Path, Path]:
    """The real-size checkpoint and its conversion (kept in --work-dir between runs)."""
    ckpt, model = work / "ckpt", work / "model"
    py = sys.executable
    if not (ckpt / "flow.pt").is_file():
        subprocess.run([py, "-m", "cosyvoice_server.convert.miniature", "--out", str(ckpt), "--size", "full",
                        "--family", family], check=True)
    if not (model / "model.yaml").is_file():
        subprocess.run([py, "-m", "cosyvoice_server.cli", "convert", "--checkpoint", str(ckpt), "--out", str(model)],
                       check=True)
    return ckpt, model


def add_prompt_voice(ckpt: Path, model: Path, name: str, seconds: float) -> None:
    """A zero-shot voice with `seconds` of prompt speech (random tokens and mel: costs depend on lengths only),
    the same in upstream's spk2info.pt and the converted model's voices/, as `add_zero_shot_spk` saves one."""
    import torch

    from cosyvoice_server.engine.pipeline import Voice, save_voice
    from cosyvoice_server.frontend import TextFrontend
    from cosyvoice_server.model.manifest import load_manifest

    voices = model / "voices" / f"{name}.npz"
    info = torch.load(ckpt / "spk2info.pt", weights_only=True)
    if name in info and voices.is_file():
        return
    rng = np.random.default_rng(len(name))
    n = int(seconds * 25)  # speech tokens per second
    tokens = rng.integers(0, 6561, n).astype(np.int64)
    # the transcript as the model's prompt text (CosyVoice3's after its system prompt, as upstream registers one)
    text = np.asarray(TextFrontend.of_model(model, load_manifest(model).frontend).prompt_tokens(
        "A voice prompt of a few words."), np.int64)
    mel = (rng.standard_normal((2 * n, 80)) * 0.5).astype(np.float32)
    emb = rng.standard_normal(192).astype(np.float32)
    t = lambda a: torch.from_numpy(a.astype(np.int32))[None]  # noqa: E731
    info[name] = {"prompt_text": t(text), "prompt_text_len": torch.tensor([len(text)], dtype=torch.int32),
                  "llm_prompt_speech_token": t(tokens), "llm_prompt_speech_token_len": torch.tensor([n], dtype=torch.int32),
                  "flow_prompt_speech_token": t(tokens), "flow_prompt_speech_token_len": torch.tensor([n], dtype=torch.int32),
                  "prompt_speech_feat": torch.from_numpy(mel)[None],
                  "prompt_speech_feat_len": torch.tensor([2 * n], dtype=torch.int32),
                  "llm_embedding": torch.from_numpy(emb)[None], "flow_embedding": torch.from_numpy(emb)[None]}
    torch.save(info, ckpt / "spk2info.pt")
    save_voice(voices, Voice(name, emb, text, tokens, mel))


class Served:
    def __init__(self, name: str, cmd: list[str], port: int, log: Path) -> None:
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self._log = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)

    def wait(self, timeout: float = 900) -> Served:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} (see its log)")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"{self.name} not ready after {timeout} s")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stage_seconds(self) -> dict[str, float]:
        if self.name == "upstream":
            return httpx.get(self.url + "/stats", timeout=10).json()
        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("cosyvoice_stage_compute_seconds_sum{"):
                out[line.split('stage="')[1].split('"')[0]] = float(line.split()[-1])
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


async def level(s: Served, concurrency: int, requests: int, seed: int, voice: str | None = None) -> dict:
    before = s.stage_seconds()
    cls = clients(s.url, 1, timeout=3600)  # at real size a saturated CPU leaves minutes between a stream's chunks
    results = []

    async def user(i: int) -> None:
        for k in range(requests):
            text = SENTENCES[(i * requests + k + seed) % len(SENTENCES)]
            t0 = time.perf_counter()
            try:
                results.append(await one(cls[0], text, seed * 1000 + i * 100 + k, True, voice))
            except httpx.HTTPError:  # a stream cut short counts as a failed request
                results.append(Result(0, time.perf_counter() - t0, None, 0.0, t0))

    t0 = time.perf_counter()
    await asyncio.gather(*[user(i) for i in range(concurrency)])
    wall = time.perf_counter() - t0
    for c in cls:
        await c.aclose()
    after = s.stage_seconds()
    ok = [r for r in results if r.code == 200 and r.ttfa is not None]
    ttfa = np.array([r.ttfa for r in ok])
    return {"system": s.name, "concurrency": concurrency, "requests": len(results), "ok": len(ok),
            "audio_s": round(sum(r.audio_s for r in ok), 2), "wall_s": round(wall, 2),
            "audio_s_per_wall_s": round(sum(r.audio_s for r in ok) / wall, 4),
            "ttfa_p50_s": round(float(np.percentile(ttfa, 50)), 2) if len(ok) else None,
            "ttfa_p95_s": round(float(np.percentile(ttfa, 95)), 2) if len(ok) else None,
            "latency_p50_s": round(float(np.percentile([r.latency for r in ok], 50)), 2) if ok else None,
            "rss_mib": round(s.rss_mib()),
            "stage_s": {k: round(after.get(k, 0) - before.get(k, 0), 1) for k in after}}


def table(rows: list[dict], baseline: str = "upstream") -> str:
    out = ["| system | concurrency | audio s / wall s | x upstream | TTFA p50 / p95 (s) | x upstream (p50) | "
           "latency p50 (s) | RSS MiB | stage compute s |", "|---|---|---|---|---|---|---|---|---|"]
    base = {r["concurrency"]: r for r in rows if r["system"] == baseline}
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["system"])):
        b = base.get(r["concurrency"])
        tput = f"{r['audio_s_per_wall_s'] / b['audio_s_per_wall_s']:.2f}" if b and b["audio_s_per_wall_s"] else ""
        ttfa = f"{r['ttfa_p50_s'] / b['ttfa_p50_s']:.2f}" if b and b["ttfa_p50_s"] and r["ttfa_p50_s"] else ""
        stages = ", ".join(f"{k} {v}" for k, v in sorted(r["stage_s"].items()))
        out.append(f"| {r['system']} | {r['concurrency']} | {r['audio_s_per_wall_s']:.3f} | {tput} | "
                   f"{r['ttfa_p50_s']} / {r['ttfa_p95_s']} | {ttfa} | {r['latency_p50_s']} | {r['rss_mib']} | {stages} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/cosyvoice-vs-upstream"))
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--requests", type=int, default=2, help="streamed requests each client sends, one after another")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=FLAGS: a server run with these extra flags (default: one 'server' with none)")
    ap.add_argument("--prompt-seconds", type=float, default=0,
                    help="speak with a zero-shot voice with this much prompt speech (0: the model's default voice, "
                         "an SFT speaker without prompt speech)")
    ap.add_argument("--upstream-threads", type=int, default=0, help="torch threads upstream uses (0: every core)")
    ap.add_argument("--family", choices=("cosyvoice2", "cosyvoice3"), default="cosyvoice2")
    ap.add_argument("--upstream", type=Path, help="cosyvoice3: a checkout of FunAudioLLM/CosyVoice (git clone)")
    ap.add_argument("--out", type=Path, help="results JSON (default: WORK_DIR/results.json)")
    args = ap.parse_args(argv)
    if args.family == "cosyvoice3" and args.upstream is None:
        ap.error("--family cosyvoice3 needs --upstream: a checkout of FunAudioLLM/CosyVoice (no package ships "
                 "upstream's CosyVoice3 code)")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    ckpt, model = build(args.work_dir, args.family)
    voice = None
    if args.prompt_seconds:
        voice = f"prompt{args.prompt_seconds:g}s"
        add_prompt_voice(ckpt, model, voice, args.prompt_seconds)
    variants = [v.split("=", 1) for v in args.variant] or [["server", ""]]
    py = sys.executable
    systems = []
    try:
        for name, flags in variants:
            port = free_port()
            # A saturated CPU takes minutes per request at this size: no deadline cuts a measured stream.
            systems.append(Served(name, [py, "-m", "cosyvoice_server.cli", "serve", "--model-dir", str(model), "--host",
                                         "127.0.0.1", "--port", str(port), "--request-timeout-s", "1800",
                                         *shlex.split(flags)],
                                  port, args.work_dir / f"{name}.log").wait())
        port = free_port()
        ref = (["bench.vs_upstream.upstream3_server", "--upstream", str(args.upstream)] if args.family == "cosyvoice3"
               else ["bench.vs_upstream.upstream_server"])
        systems.append(Served("upstream", [py, "-m", *ref, "--checkpoint", str(ckpt), "--model-dir", str(model),
                                           "--port", str(port), "--threads", str(args.upstream_threads)],
                              port, args.work_dir / "upstream.log").wait())
        for s in systems:  # one request each, so no system's first measured request pays lazy start-up work
            asyncio.run(level(s, 1, 1, 0, voice))  # (nor the voice's first use: the server keeps its prompt states)
        rows = []
        for rnd in range(args.rounds):
            for c in (int(x) for x in args.concurrency.split(",")):
                order = systems if rnd % 2 == 0 else systems[::-1]
                for s in order:
                    row = asyncio.run(level(s, c, args.requests, rnd, voice))
                    row["round"] = rnd
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for s in systems:
            s.stop()
    report = {"command": " ".join(["python -m bench.vs_upstream", *(argv if argv is not None else sys.argv[1:])]),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "rows": rows}
    out = args.out or args.work_dir / "results.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
