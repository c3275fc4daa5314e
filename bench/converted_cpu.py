"""Stage timings of a converted model directory on the CPU: one LLM decode step (batch 1 and 8), one
flow run (a first streamed chunk of 25 tokens, a 100-token segment), HiFT for one second of audio.

    python -m cosyvoice_server.convert.miniature --out /tmp/ckpt --size full   # CosyVoice2-0.5B's sizes
    cosyvoice-server convert --checkpoint /tmp/ckpt --out /tmp/model
    python -m bench.converted_cpu /tmp/model [THREADS]
"""
import json
import sys
import time
from pathlib import Path
import numpy as np
from cosyvoice_server.engine.pipeline import Pipeline
from cosyvoice_server.engine.flow import FlowChunk, VocoderInput
from cosyvoice_server.engine.runtime import RuntimeOptions

model = Path(sys.argv[1])
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
p = Pipeline(model, "cpu", "fp32", RuntimeOptions(intra_op_threads=threads))
rng = np.random.default_rng(0)
v = p.voices[p.manifest.voices.default]
res = {}
# LLM: prefill 40 text tokens, then decode steps at batch 1 and 8
for b in (1, 8):
    seqs = [p.llm.sequence(rng.integers(0, 300, 40), v.prompt_text_tokens, v.prompt_speech_tokens, np.random.default_rng(i), None) for i in range(b)]
    for q in seqs: q.min_len, q.max_len = 10**6, 10**6
    batch = p.llm.prefill(seqs)
    for _ in range(3): p.llm.step(batch)
    t = time.perf_counter(); n = 20
    for _ in range(n): p.llm.step(batch)
    res[f"llm_step_b{b}_ms"] = (time.perf_counter() - t) / n * 1000
# flow: a first streamed chunk (25 tokens + 3 lookahead) and a 100-token non-streamed segment
def chunk(n, final):
    toks = rng.integers(0, 6561, n + (0 if final else 3))
    P = len(v.prompt_speech_tokens)
    return FlowChunk(np.concatenate([v.prompt_speech_tokens, toks]), P + n, 0 if final else 3, not final, 2 * P, 0, v.embedding, v.prompt_mel)
for name, c in (("flow_chunk_25tok_ms", chunk(25, False)), ("flow_segment_100tok_ms", chunk(100, True))):
    p.flow.run([c])
    t = time.perf_counter(); p.flow.run([c]); res[name] = (time.perf_counter() - t) * 1000
mel = rng.standard_normal((80, 50)).astype(np.float32)
it = VocoderInput(mel, rng.standard_normal((50 * 480, 9)).astype(np.float32), np.zeros(0, np.float32))
p.vocoder.run([it])
t = time.perf_counter(); p.vocoder.run([it]); res["hift_1s_audio_ms"] = (time.perf_counter() - t) * 1000
print(json.dumps({k: round(v, 1) for k, v in res.items()}, indent=1))
