"""The pipeline as a request-level batch function: what a generic model server (Triton's dynamic
batcher, LitServe) can host. A batch of whole requests goes through the LLM together until the last
one stops, then through flow and vocoder in one run each; no streaming, no joining mid-batch."""

from __future__ import annotations

import numpy as np

from cosyvoice_server.engine.flow import FlowChunk
from cosyvoice_server.engine.pipeline import Pipeline


def synthesize_batch(p: Pipeline, requests: list[tuple[str, int]]) -> list[np.ndarray]:
    """(text, seed) per request -> float32 audio at the model's sample rate."""
    voice = p.voices[p.manifest.voices.default]
    rngs = [np.random.default_rng(seed) for _, seed in requests]
    tokens: list[list[int]] = [[] for _ in requests]
    segments = [p.frontend.segments(text) for text, _ in requests]
    for round_ in range(max(len(s) for s in segments)):
        owners = [i for i, s in enumerate(segments) if round_ < len(s)]
        seqs = [p.llm.sequence(segments[i][round_], voice.prompt_text_tokens, voice.prompt_speech_tokens, rngs[i], i)
                for i in owners]
        batch = p.llm.prefill(seqs)
        while batch is not None:
            keep = [j for j, q in enumerate(batch.seqs) if not q.done]
            batch = p.llm.keep(batch, keep)
            if batch is not None:
                p.llm.step(batch)
        for q in seqs:
            tokens[q.owner].extend(q.tokens)
    ratio = p.manifest.token_mel_ratio
    chunks = []
    for i, toks in enumerate(tokens):
        all_tokens = np.concatenate([voice.prompt_speech_tokens, np.asarray(toks, np.int64)])
        chunks.append(FlowChunk(all_tokens, len(voice.prompt_speech_tokens) * ratio, len(toks) * ratio, voice.embedding,
                                voice.prompt_mel, rngs[i].standard_normal((80, len(all_tokens) * ratio)).astype(np.float32)))
    live = [i for i, t in enumerate(tokens) if t]
    mels = p.flow.run([chunks[i] for i in live]) if live else []
    wavs = p.vocoder.run(mels) if mels else []
    out = [np.zeros(0, np.float32) for _ in requests]
    for i, w in zip(live, wavs):
        out[i] = w
    return out
