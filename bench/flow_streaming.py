"""The flow's compute for one streamed segment: whole (one unmasked run), streamed as upstream does it (every
chunk re-runs the flow over the prompt and all tokens so far), streamed incrementally (each chunk computes
only its new frames from the segment's cache) for a voice's first segment, and for a later one (its first
chunk starts after the voice's kept prompt states), with the first chunk's time, the largest chunk error
and the cache's memory.

    python -m bench.flow_streaming --model-dir /tmp/model-full [--seconds 3.5 10 20] [--prompt-seconds 3] [--threads 2] [--rounds 2]

Chunks follow upstream's plan (hop 25 tokens + the prompt's pad, doubling to 100; 3 look-ahead tokens). The
tokens are random (the flow's cost does not depend on their values); the voice is the model's default
embedding with a random prompt of --prompt-seconds (a zero-shot voice's prompt is a few seconds of speech).
The ways run interleaved for --rounds rounds; each row keeps every way's fastest round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from cosyvoice_server.engine.flow import FlowChunk
from cosyvoice_server.engine.pipeline import Pipeline, Voice
from cosyvoice_server.engine.runtime import RuntimeOptions
from cosyvoice_server.streaming import ChunkPlanner


def prompt_voice(p: Pipeline, seconds: float, rng: np.random.Generator) -> Voice:
    """A voice the flow has not seen (its prompt states are not kept yet)."""
    m = p.manifest
    n = int(seconds * m.token_rate)
    tokens = rng.integers(0, m.llm.speech_token_size, n).astype(np.int64)
    mel = (rng.standard_normal((n * m.token_mel_ratio, m.flow.mel_bins)) * 0.5).astype(np.float32)
    return Voice("bench", p.voices[m.voices.default].embedding, tokens[:0], tokens, mel)


def plan(p: Pipeline, v: Voice, tokens: np.ndarray, cache, stream: bool = True) -> list[FlowChunk]:
    m = p.manifest
    s, la, pt = m.streaming, m.flow.pre_lookahead_tokens, v.prompt_speech_tokens
    planner = ChunkPlanner(s.first_hop_tokens, s.max_hop_tokens, s.hop_growth, la, len(pt), stream)
    out = []
    while (span := planner.next(len(tokens), True)) is not None:
        ctx = 0 if span.final else la
        out.append(FlowChunk(np.concatenate([pt, tokens[: span.end + ctx]]), len(pt) + span.end, ctx, not span.final,
                             len(pt) * m.token_mel_ratio, span.offset * m.token_mel_ratio, v.embedding, v.prompt_mel,
                             cache))
    return out


def timed(p: Pipeline, chunks: list[FlowChunk]) -> tuple[float, list[np.ndarray], int, float]:
    """Seconds, the chunks' mel, the most bytes the cache held for them, and the first chunk's seconds."""
    t0, mels, peak, first, before = time.perf_counter(), [], 0, 0.0, p.flow.ledger.used
    for c in chunks:
        mels.append(p.flow.run([c])[0])
        first = first or time.perf_counter() - t0
        peak = max(peak, p.flow.ledger.used - before)
    return time.perf_counter() - t0, mels, peak, first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--seconds", type=float, nargs="+", default=[3.5, 10.0])
    ap.add_argument("--prompt-seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of the flow's sessions")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    p = Pipeline(args.model_dir, args.device, "fp32", RuntimeOptions(intra_op_threads=args.threads), flow_cache_bytes=1 << 40)
    if p.flow.incremental is None:
        sys.exit(f"{args.model_dir}: the model has no incremental estimator (convert it again)")
    rng = np.random.default_rng(0)
    rows = []
    for seconds in args.seconds:
        tokens = rng.integers(0, p.manifest.llm.speech_token_size, int(seconds * p.manifest.token_rate)).astype(np.int64)
        t_min = {k: float("inf") for k in ("whole", "rerun", "incremental", "kept", "incremental_first", "kept_first")}
        err = 0.0
        for _ in range(args.rounds):
            voice = prompt_voice(p, args.prompt_seconds, rng)  # the same rerun and whole for any voice
            prompt = len(voice.prompt_speech_tokens)
            runs = {"whole": timed(p, plan(p, voice, tokens, None, stream=False)), "rerun": timed(p, plan(p, voice, tokens, None))}
            runs["incremental"] = timed(p, plan(p, voice, tokens, p.flow.new_cache()))  # keeps the voice's prompt states
            runs["kept"] = timed(p, plan(p, voice, tokens, p.flow.new_cache()))  # starts after them
            for k, (t, mels, peak, first) in runs.items():
                t_min[k] = min(t_min[k], t)
                if k in ("incremental", "kept"):
                    t_min[k + "_first"] = min(t_min[k + "_first"], first)
                    err = max([err] + [float(np.abs(a - b).max()) for a, b in zip(runs["rerun"][1], mels)])
        peak = runs["incremental"][2]
        audio_s = (prompt + len(tokens)) / p.manifest.token_rate
        row = {"segment_s": seconds, "prompt_s": prompt / p.manifest.token_rate, "chunks": len(runs["rerun"][1]),
               **{f"{k}_s": round(v, 2) for k, v in t_min.items()},
               **{f"{k}_x_whole": round(t_min[k] / t_min["whole"], 2) for k in ("rerun", "incremental", "kept")},
               "kept_first_x_incremental_first": round(t_min["kept_first"] / t_min["incremental_first"], 2),
               "max_abs_err": err, "cache_peak_mib": round(peak / 2**20, 1),
               "cache_mib_per_audio_s": round(peak / 2**20 / audio_s, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
