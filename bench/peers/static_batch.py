"""The pipeline as a request-level batch function: what a generic model server (Triton's dynamic
batcher, LitServe) can host. A batch of whole requests goes through the LLM together until the last
one stops, then through flow and vocoder in one run each; no streaming, no joining mid-batch."""

from __future__ import annotations

import numpy as np

from cosyvoice_server.engine.flow import FlowChunk, VocoderInput
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
    # Each request's tokens in one unmasked flow run, as upstream's non-streamed `token2wav` (finalize).
    prompt, ratio = voice.prompt_speech_tokens, p.manifest.token_mel_ratio
    live = [i for i, t in enumerate(tokens) if t]
    chunks = [FlowChunk(np.concatenate([prompt, np.asarray(tokens[i], np.int64)]), len(prompt) + len(tokens[i]), 0,
                        False, len(prompt) * ratio, 0, voice.embedding, voice.prompt_mel) for i in live]
    mels = p.flow.run(chunks) if chunks else []
    items = [VocoderInput(m, rngs[i].standard_normal((m.shape[1] * p.vocoder.hop, p.vocoder.harmonics), np.float32),
                          np.zeros(0, np.float32)) for i, m in zip(live, mels)]
    out = [np.zeros(0, np.float32) for _ in requests]
    for i, (wav, _) in zip(live, p.vocoder.run(items) if items else []):
        out[i] = wav
    return out
