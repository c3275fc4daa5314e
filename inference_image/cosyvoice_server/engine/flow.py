"""The flow stage (speech tokens -> mel) and the vocoder stage (mel -> waveform), batched across
requests. Chunks of different lengths are right-padded and masked; the padding is zeros, which is
what the graphs' own convolution padding is, so a chunk's output does not depend on its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.manifest import Flow as FlowSpec
from .device_ops import CFMStep
from .runtime import Runtime


@dataclass
class FlowChunk:
    tokens: np.ndarray  # prompt speech tokens + chunk tokens + lookahead tokens
    prompt_frames: int  # mel frames of the prompt (conditioning prefix, not returned)
    out_frames: int  # mel frames returned (the chunk's own tokens)
    embedding: np.ndarray  # [192] speaker embedding
    prompt_mel: np.ndarray  # [prompt_frames, 80]
    noise: np.ndarray  # [80, frames of tokens] initial flow-matching state, drawn per request


def cosine_t_span(n: int) -> np.ndarray:
    t = np.linspace(0.0, 1.0, n + 1)
    return (1.0 - np.cos(t * 0.5 * math.pi)).astype(np.float32)


class FlowEngine:
    def __init__(self, rt: Runtime, encoder: Path, estimator: Path, spec: FlowSpec, token_mel_ratio: int) -> None:
        self.rt = rt
        self.spec = spec
        self.ratio = token_mel_ratio
        self.encoder = rt.session(encoder)
        self.estimator = rt.session(estimator)
        self.cfm_step = CFMStep(rt)
        self.t_span = cosine_t_span(spec.n_timesteps)

    def run(self, chunks: list[FlowChunk]) -> list[np.ndarray]:
        b = len(chunks)
        n = max(len(c.tokens) for c in chunks)
        frames = n * self.ratio
        tokens = np.zeros((b, n), np.int64)
        lens = np.array([len(c.tokens) for c in chunks], np.int64)
        for i, c in enumerate(chunks):
            tokens[i, : len(c.tokens)] = c.tokens
        emb = np.stack([c.embedding for c in chunks]).astype(np.float32)
        mu, spks = self.encoder.run(["mu", "spks"], {"token": tokens, "token_len": lens, "embedding": emb})

        mask = np.zeros((b, 1, frames), np.float32)
        cond = np.zeros((b, 80, frames), np.float32)
        x = np.zeros((b, 80, frames), np.float32)
        for i, c in enumerate(chunks):
            f = int(lens[i]) * self.ratio
            mask[i, 0, :f] = 1.0
            cond[i, :, : c.prompt_frames] = c.prompt_mel.T
            x[i, :, :f] = c.noise[:, :f]
        zeros = np.zeros_like(mu)
        # Classifier-free guidance: the estimator sees each chunk twice, with and without conditions.
        dev = self.rt.to_device
        mask2, mu2 = dev(np.concatenate([mask, mask])), dev(np.concatenate([mu, zeros]))
        spks2 = dev(np.concatenate([spks, np.zeros_like(spks)]))
        cond2 = dev(np.concatenate([cond, np.zeros_like(cond)]))
        x_dev, x2 = dev(x), dev(np.concatenate([x, x]))
        for k in range(self.spec.n_timesteps):
            t0, t1 = float(self.t_span[k]), float(self.t_span[k + 1])
            bind = self.estimator.io_binding()
            bind.bind_ortvalue_input("x", x2)
            bind.bind_ortvalue_input("mask", mask2)
            bind.bind_ortvalue_input("mu", mu2)
            bind.bind_cpu_input("t", np.full(2 * b, t0, np.float32))
            bind.bind_ortvalue_input("spks", spks2)
            bind.bind_ortvalue_input("cond", cond2)
            self.rt.bind_out(bind, "estimator_out")
            self.estimator.run_with_iobinding(bind)
            x_dev, x2 = self.cfm_step(x_dev, bind.get_outputs()[0], t1 - t0, self.spec.cfg_rate)
        mel = x_dev.numpy()
        return [mel[i, :, c.prompt_frames : c.prompt_frames + c.out_frames] for i, c in enumerate(chunks)]


class VocoderEngine:
    def __init__(self, rt: Runtime, path: Path, hop_samples: int) -> None:
        self.session = rt.session(path)
        self.hop = hop_samples

    def run(self, mels: list[np.ndarray]) -> list[np.ndarray]:
        frames = max(m.shape[1] for m in mels)
        batch = np.zeros((len(mels), mels[0].shape[0], frames), np.float32)
        for i, m in enumerate(mels):
            batch[i, :, : m.shape[1]] = m
        wav = self.session.run(["waveform"], {"speech_feat": batch})[0]
        return [wav[i, : m.shape[1] * self.hop] for i, m in enumerate(mels)]
