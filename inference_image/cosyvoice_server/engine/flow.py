"""The flow stage (speech tokens -> mel) and the vocoder stage (mel -> waveform), batched across
requests, with upstream CosyVoice2's semantics per chunk (`CausalMaskedDiffWithXvec.inference`,
`HiFTGenerator.inference`).

Flow rows of different lengths are right-padded: the encoder masks and the estimator's causal
convolutions keep a row's output independent of its batch. The vocoder is not causal (its
convolutions and STFT look both ways), so it batches only chunks of equal length.
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
    """One `flow.inference` call: prompt + tokens[:end] (+ the pre-lookahead context when not final)."""

    tokens: np.ndarray  # prompt speech tokens + this segment's tokens so far (+ context tokens)
    token_len: int  # prompt + tokens, without the context
    context_len: int  # pre-lookahead tokens after them (0 for the final chunk: finalize)
    streaming: bool  # chunk attention masks (upstream streams every chunk but the final one)
    prompt_frames: int  # mel frames of the prompt (conditioning prefix, not returned)
    offset_frames: int  # frames already returned by earlier chunks of this segment
    embedding: np.ndarray  # [192] speaker embedding
    prompt_mel: np.ndarray  # [prompt_frames, 80]


def segment_token_room(max_frames: int, token_mel_ratio: int, prompt_tokens: int) -> int:
    """Speech tokens one segment may have after a voice's `prompt_tokens`: each flow run covers the prompt and
    the segment's tokens so far, and its fixed noise holds `max_frames` mel frames (upstream indexes past it)."""
    return max_frames // token_mel_ratio - prompt_tokens


def cosine_t_span(n: int) -> np.ndarray:
    t = np.linspace(0.0, 1.0, n + 1, dtype=np.float32)
    return (1.0 - np.cos(t * np.float32(0.5 * math.pi))).astype(np.float32)


class FlowEngine:
    def __init__(self, rt: Runtime, encoder: Path, estimator: Path, spec: FlowSpec, token_mel_ratio: int,
                 noise: np.ndarray) -> None:
        self.rt = rt
        self.spec = spec
        self.ratio = token_mel_ratio
        self.encoder = rt.session(encoder, "flow_encoder")
        self.estimator = rt.session(estimator, "flow_estimator")
        self.cfm_step = CFMStep(rt)
        self.t_span = cosine_t_span(spec.n_timesteps)
        self.noise = noise  # [80, max frames]

    @property
    def max_frames(self) -> int:
        return self.noise.shape[1]

    def token_room(self, prompt_tokens: int) -> int:
        return segment_token_room(self.max_frames, self.ratio, prompt_tokens)

    def run(self, chunks: list[FlowChunk]) -> list[np.ndarray]:
        b = len(chunks)
        n = max(len(c.tokens) for c in chunks)
        tokens = np.zeros((b, n), np.int64)
        for i, c in enumerate(chunks):
            tokens[i, : len(c.tokens)] = c.tokens
        lens = np.array([c.token_len for c in chunks], np.int64)
        emb = np.stack([c.embedding for c in chunks]).astype(np.float32)
        streaming = np.array([int(c.streaming) for c in chunks], np.int64)
        mu, spks = self.encoder.run(["mu", "spks"], {
            "token": tokens, "token_len": lens, "context_len": np.array([c.context_len for c in chunks], np.int64),
            "streaming": streaming, "embedding": emb})
        frames = int(lens.max()) * self.ratio
        if frames > self.max_frames:
            raise ValueError(f"{frames} mel frames exceed the flow noise buffer ({self.max_frames})")
        mu = np.ascontiguousarray(mu[:, :, :frames])

        mask = np.zeros((b, 1, frames), np.float32)
        cond = np.zeros((b, 80, frames), np.float32)
        x = np.zeros((b, 80, frames), np.float32)
        for i, c in enumerate(chunks):
            f = c.token_len * self.ratio
            mask[i, 0, :f] = 1.0
            cond[i, :, : c.prompt_frames] = c.prompt_mel.T
            x[i, :, :f] = self.noise[:, :f]  # upstream's fixed noise, from frame 0 for every call
        # Classifier-free guidance: the estimator sees each chunk twice, with and without conditions.
        dev = self.rt.to_device
        mask2, mu2 = dev(np.concatenate([mask, mask])), dev(np.concatenate([mu, np.zeros_like(mu)]))
        spks2 = dev(np.concatenate([spks, np.zeros_like(spks)]))
        cond2 = dev(np.concatenate([cond, np.zeros_like(cond)]))
        streaming2 = np.concatenate([streaming, streaming])
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
            bind.bind_cpu_input("streaming", streaming2)
            self.rt.bind_out(bind, "estimator_out")
            self.estimator.run_with_iobinding(bind)
            x_dev, x2 = self.cfm_step(x_dev, bind.get_outputs()[0], t1 - t0, self.spec.cfg_rate)
        mel = x_dev.numpy()  # may share ONNX Runtime's buffer, which a later run reuses: the chunks are copies
        return [mel[i, :, c.prompt_frames + c.offset_frames : c.token_len * self.ratio].copy() for i, c in enumerate(chunks)]


@dataclass
class VocoderInput:
    mel: np.ndarray  # [80, frames]
    noise: np.ndarray  # [frames * hop, harmonics]: the source module's Gaussian noise
    cache_source: np.ndarray  # [cached samples]: replaces the head of the source signal


class VocoderEngine:
    def __init__(self, rt: Runtime, path: Path, hop_samples: int) -> None:
        self.session = rt.session(path, "vocoder")
        self.hop = hop_samples
        noise = next(i for i in self.session.get_inputs() if i.name == "noise")
        self.harmonics = int(noise.shape[-1])

    def run(self, items: list[VocoderInput]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(waveform, source) per item; items of equal length and cache run as one batch."""
        out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(items)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault((it.mel.shape[1], len(it.cache_source)), []).append(i)
        for idx in groups.values():
            feed = {
                "speech_feat": np.stack([items[i].mel for i in idx]).astype(np.float32),
                "noise": np.stack([items[i].noise for i in idx]).astype(np.float32),
                "cache_source": np.stack([items[i].cache_source for i in idx]).astype(np.float32)[:, None, :],
            }
            wav, source = self.session.run(["waveform", "source"], feed)
            for j, i in enumerate(idx):
                out[i] = (wav[j], source[j, 0])
        return out  # type: ignore[return-value]
