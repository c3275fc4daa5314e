"""GPU benchmark at CosyVoice2's real layer sizes (random weights), in-process, no HTTP.

    python -m bench.gpu --out RESULTS_DIR [--model-dir CACHE] [--device cuda]

Reports time to first audio at concurrency 1, 4, 16 (streaming chunks, as the server sends them),
real-time factor, throughput against batch size, and the GPU memory one replica holds: the number
that decides which MIG profile a CosyVoiceService should request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path


from cosyvoice_server.gpu import nvml_devices

from .engine_limit import Engine
from .run import machine, summarize

TEXT = "CosyVoice two streams speech in small chunks, so the listener hears the first words quickly."


def gpu_memory_used() -> int | None:
    devices, _ = nvml_devices()
    return sum(d.memory_used for d in devices) if devices else None


def ensure_model(cache: Path) -> Path:
    """The full-size model (random weights at CosyVoice2-0.5B's sizes, a miniature checkpoint converted: about
    2 GB per precision) is built on first use and reused after; the `convert` extra and upstream's CosyVoice2
    package must be importable (carry them as wheels to a machine that reaches no network)."""
    if not (cache / "model.yaml").is_file():
        import tempfile

        from cosyvoice_server.convert.convert import convert
        from cosyvoice_server.convert.miniature import build

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            convert(build(Path(tmp) / "ckpt", "full"), cache, ["fp32", "fp16"])
        print(f"built {cache} in {time.perf_counter() - t0:.0f} s", flush=True)
    return cache


async def measure(engine: Engine, concurrency: list[int], duration: float) -> dict:
    out = {}
    for c in concurrency:
        rs = await engine.closed_loop(c, duration, TEXT)
        s = summarize(rs, duration)
        s.pop("ttfa_samples_ms", None)
        out[str(c)] = s
        print(f"  c={c}: {s.get('rps', 0):.2f} req/s, TTFA p50 {s.get('ttfa_p50_ms') or 0:.0f} ms, "
              f"p50 {s.get('p50_ms') or 0:.0f} ms, RTF {s.get('rtf', 0):.3f}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model-dir", default=str(Path.home() / ".cache" / "cosyvoice-server" / "cosyvoice2-fullsize"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precisions", default="fp16,fp32")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--ttfa-concurrency", default="1,4,16")
    ap.add_argument("--batch-sizes", default="1,4,16,32")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = ensure_model(Path(args.model_dir))
    res: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "device": args.device, "text": TEXT,
                 "command": " ".join(["python -m bench.gpu", *sys.argv[1:]]), "runs": {}}
    for precision in args.precisions.split(","):
        print(f"{precision}:", flush=True)
        base = gpu_memory_used()
        run: dict = {}
        for mb in [int(b) for b in args.batch_sizes.split(",")]:
            engine = Engine(model, args.device, mb, precision=precision)
            loaded = gpu_memory_used()
            conc = [int(c) for c in args.ttfa_concurrency.split(",")] if mb == max(int(b) for b in args.batch_sizes.split(",")) else [mb]
            run[f"max_batch_{mb}"] = asyncio.run(measure(engine, sorted(set(conc + [mb])), args.duration))
            peak = gpu_memory_used()
            if base is not None:
                run[f"max_batch_{mb}"]["gpu_memory_bytes"] = {"after_load": loaded - base, "after_load_test": peak - base}
            engine.close()
            del engine
        res["runs"][precision] = run
    (out / "gpu_results.json").write_text(json.dumps(res, indent=1))
    lines = ["| precision | max batch | concurrency | req/s | TTFA p50 ms | TTFA p95 ms | p50 ms | RTF | GPU memory (load / after test) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for precision, run in res["runs"].items():
        for key, rows in run.items():
            mem = rows.get("gpu_memory_bytes")
            mem_s = f"{mem['after_load'] / 2**30:.1f} / {mem['after_load_test'] / 2**30:.1f} GiB" if mem else "n/a"
            for c, s in rows.items():
                if c == "gpu_memory_bytes":
                    continue
                lines.append(f"| {precision} | {key.split('_')[-1]} | {c} | {s.get('rps', 0):.2f} | {s.get('ttfa_p50_ms') or 0:.0f} "
                             f"| {s.get('ttfa_p95_ms') or 0:.0f} | {s.get('p50_ms') or 0:.0f} | {s.get('rtf', 0):.3f} | {mem_s} |")
    (out / "gpu_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
