"""How each stage's time grows with its batch, per model directory: the flow encoder over a streamed segment's
tokens so far, the estimator and the vocoder on a first chunk (the start-up probe's calls), and one LLM decode
step. Batching pays where the time for 8 rows is well under 8 × one row's (per-call overhead shared), not where
it is close (arithmetic, which a CPU does row by row).

    python -m bench.batch_scaling inference_image/cosyvoice_server/models/tiny [MODEL_DIR ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.engine.runtime import RuntimeOptions
from cosyvoice_server.scheduling import probe

BATCHES = (1, 8)


def _best_ms(run: Callable[[], object], repeat: int = 5) -> float:
    run()  # ONNX Runtime plans each new shape once
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return round(min(times) * 1000, 2)


def encoder_ms(p: Pipeline, b: int, tokens: int) -> float:
    enc = p.flow.encoder
    names = {i.name for i in enc.get_inputs()}
    rng = np.random.default_rng(0)
    feed = {"token": rng.integers(0, p.manifest.llm.speech_token_size, (b, tokens)), "token_len": np.full(b, tokens),
            "context_len": np.zeros(b, np.int64), "streaming": np.ones(b, np.int64),
            "embedding": rng.standard_normal((b, 192)).astype(np.float32)}
    feed = {k: v.astype(np.int64) if v.dtype.kind == "i" else v for k, v in feed.items() if k in names}
    return _best_ms(lambda: enc.run(None, feed))


def llm_step_ms(p: Pipeline, b: int) -> float:
    v = p.voices[p.manifest.voices.default]
    seqs = [p.llm.sequence(np.arange(20) % 200, v.prompt_text_tokens, v.llm_prompt_speech_tokens,
                           np.random.default_rng(i), None) for i in range(b)]
    for q in seqs:
        q.min_len = q.max_len = 10**6
    batch = p.llm.prefill(seqs)
    return _best_ms(lambda: p.llm.step(batch), 20)


def measure(model: Path) -> dict:
    p = Pipeline(model, "cpu", "fp32", RuntimeOptions(intra_op_threads=1, flow_threads=1))
    stages: dict[str, Callable[[int], float]] = {
        "flow encoder, 60 tokens": lambda b: encoder_ms(p, b, 60),
        "flow encoder, 120 tokens": lambda b: encoder_ms(p, b, 120),
        "flow estimator, first chunk": lambda b: _best_ms(lambda: probe.flow_cost(p, b)),
        "vocoder, one chunk": lambda b: _best_ms(lambda: probe.vocoder_cost(p, b)),
        "LLM decode step": lambda b: llm_step_ms(p, b),
    }
    return {"model": str(model), "family": p.manifest.family,
            "ms": {name: {b: fn(b) for b in BATCHES} for name, fn in stages.items()}}


def table(results: list[dict]) -> str:
    head = "| stage, batch 1 → 8 | " + " | ".join(f"`{'/'.join(Path(r['model']).parts[-2:])}` ({r['family']})" for r in results) + " |"
    rows = [head, "|---" * (len(results) + 1) + "|"]
    for stage in results[0]["ms"]:
        cells = []
        for r in results:
            one, eight = (r["ms"][stage][b] for b in BATCHES)
            cells.append(f"{one:g} → {eight:g} ms ({eight / one:.1f} ×)")
        rows.append(f"| {stage} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="also write the measurements here")
    args = ap.parse_args(argv)
    results = [measure(m) for m in args.models]
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
