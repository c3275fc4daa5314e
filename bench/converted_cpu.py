"""Stage timings of a converted model directory (either family) on the CPU: one LLM decode step (batch 1 and 8),
the flow for a streamed segment's chunks (a first chunk of 25 tokens, then a 50-token one, each alone and four
segments batched; new frames only where the model has the incremental estimator), a 100-token segment's final
run, and the vocoder per second of audio (a causal vocoder's chunk re-vocodes the segment so far: its cost per
chunk grows with the segment).

    python -m cosyvoice_server.convert.miniature --out /tmp/ckpt --size full [--family cosyvoice3]
    cosyvoice-server convert --checkpoint /tmp/ckpt --out /tmp/model
    python -m bench.converted_cpu /tmp/model [--threads 2] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from cosyvoice_server.engine.flow import FlowChunk, VocoderInput
from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.engine.runtime import RuntimeOptions
from cosyvoice_server.streaming import seams_of


def _best(fn, repeat: int) -> float:
    fn()  # warm-up: ONNX Runtime plans each new shape once
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1000


def measure(model: Path, threads: int, repeat: int) -> dict:
    p = Pipeline(model, "cpu", "fp32", RuntimeOptions(intra_op_threads=threads, flow_threads=threads))
    m = p.manifest
    rng = np.random.default_rng(0)
    v = p.voices[m.voices.default]
    res: dict = {"family": m.family, "threads": threads}
    text_vocab = p.llm.text_embedding.shape[0]
    for b in (1, 8):  # LLM: prefill 40 text tokens, then decode steps
        seqs = [p.llm.sequence(rng.integers(0, min(text_vocab, 300), 40), v.prompt_text_tokens, v.llm_prompt_speech_tokens,
                               np.random.default_rng(i), None) for i in range(b)]
        for q in seqs:
            q.min_len, q.max_len = 10**6, 10**6
        batch = p.llm.prefill(seqs)
        res[f"llm_step_b{b}_ms"] = _best(lambda: p.llm.step(batch), repeat * 10)
    prompt = len(v.prompt_speech_tokens)
    pad = (25 - prompt % 25) % 25
    ends = (25 + pad, 75 + pad)  # the first two chunks of a streamed segment: hop 25 (+ pad), then 50

    def chunks(segments: int, cached: bool) -> list[list[FlowChunk]]:
        out = []
        for _ in range(segments):
            toks = rng.integers(0, m.llm.speech_token_size, ends[-1] + 3)
            cache = p.flow.new_cache() if cached else None
            out.append([FlowChunk(np.concatenate([v.prompt_speech_tokens, toks[: e + 3]]), prompt + e, 3, True, 2 * prompt,
                                  2 * s, v.embedding, v.prompt_mel, cache) for s, e in zip((0, ends[0]), ends)])
        return out

    for cached in (False, True) if p.flow.incremental is not None else (False,):
        way = "new_frames" if cached else "rerun"
        for segments in (1, 4):
            runs = [[], []]
            for _ in range(repeat):
                segs = chunks(segments, cached)
                for k in range(2):
                    t = time.perf_counter()
                    p.flow.run([s[k] for s in segs])
                    runs[k].append((time.perf_counter() - t) * 1000)
                for s in segs:
                    if s[0].cache is not None:
                        s[0].cache.release()
            res[f"flow_{way}_first_chunk_x{segments}_ms"] = min(runs[0])
            res[f"flow_{way}_second_chunk_x{segments}_ms"] = min(runs[1])
    toks = rng.integers(0, m.llm.speech_token_size, 100)
    final = FlowChunk(np.concatenate([v.prompt_speech_tokens, toks]), prompt + 100, 0, False, 2 * prompt, 0, v.embedding,
                      v.prompt_mel)
    res["flow_final_100tok_ms"] = _best(lambda: p.flow.run([final]), repeat)
    seams = seams_of(m.streaming.seams, m.streaming.mel_cache_frames, m.streaming.look_right_frames, m.hop_samples)
    for seconds in (1, 4):
        mel = rng.standard_normal((80, 50 * seconds)).astype(np.float32)
        mel, cache_source = seams.mel(None, mel, True, 1.0)
        item = VocoderInput(mel, p.vocoder.noise(mel.shape[1], rng), cache_source)
        res[f"vocoder_{seconds}s_audio_ms"] = _best(lambda: p.vocoder.run([item]), repeat)
    return {k: round(x, 1) if isinstance(x, float) else x for k, x in res.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.model, args.threads, args.repeat), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
