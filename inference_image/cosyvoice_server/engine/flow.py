"""The flow stage (speech tokens -> mel) and the vocoder stage (mel -> waveform), batched across
requests, with upstream CosyVoice2's semantics per chunk (`CausalMaskedDiffWithXvec.inference`,
`HiFTGenerator.inference`).

Flow rows of different lengths are right-padded: the encoder masks and the estimator's causal
convolutions keep a row's output independent of its batch. The vocoder is not causal (its
convolutions and STFT look both ways), so it batches only chunks of equal length.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model.manifest import Flow as FlowSpec
from ..model.manifest import IncrementalEstimator
from .device_ops import CFMStep
from .runtime import Runtime


class CacheLedger:
    """The bytes every segment's FlowCache holds, against one limit: a cache that would pass it is dropped and
    its segment goes on re-running the flow over its prefix, with the same output."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0
        self._lock = threading.Lock()

    def store(self, cache: FlowCache, past: np.ndarray, conv: np.ndarray, frames: int,
              encoder: EncoderStates | None = None) -> bool:
        """Replaces the cache's arrays (now covering `frames`, and the encoder's states), or drops the cache if
        the limit would pass."""
        with self._lock:
            if cache.closed:
                return False
            nbytes = past.nbytes + conv.nbytes + (encoder.nbytes if encoder is not None else 0)
            self.used -= cache.counted
            cache.counted = 0
            if self.used + nbytes > self.limit:
                cache.close()
                return False
            self.used += nbytes
            cache.past, cache.conv, cache.frames, cache.encoder, cache.counted = past, conv, frames, encoder, nbytes
            return True

    def release(self, cache: FlowCache) -> None:
        with self._lock:
            if not cache.closed:
                self.used -= cache.counted
                cache.counted = 0
                cache.close()


@dataclass(frozen=True)
class EncoderStates:
    """What a streamed segment's masked encoder runs computed for its first `tokens` tokens (whole encoder
    chunks whose look-ahead tokens were known; convert/incremental_encoder.py): each attention layer's keys
    and values, at token and at frame rate, and the token-rate outputs the upsampling convolution reads next."""

    tokens: int
    past: np.ndarray  # [token-rate layers, tokens, 2 x width]
    up_past: np.ndarray  # [frame-rate layers, tokens x token_mel_ratio, 2 x width]
    up_state: np.ndarray  # [width, tokens the convolutions look back]

    @property
    def nbytes(self) -> int:
        return self.past.nbytes + self.up_past.nbytes + self.up_state.nbytes


@dataclass
class FlowCache:
    """What one streamed segment's masked flow runs computed for the frames of its complete chunks, per Euler
    step and guidance branch: each attention layer's normalised input and each causal convolution's last
    inputs (convert/incremental.py), and the encoder's states for the same tokens. Those frames never change
    in later masked runs, so the next chunk computes only the frames after them."""

    ledger: CacheLedger
    frames: int = 0
    past: np.ndarray | None = None  # [steps, 2, layers, frames, width]
    conv: np.ndarray | None = None  # [steps, 2, convs, channels, kernel - 1]
    encoder: EncoderStates | None = None  # None: the model has no incremental encoder, or nothing settled yet
    closed: bool = False
    counted: int = 0  # bytes of its own arrays in the ledger (a voice's prompt states it starts from are shared)

    def close(self) -> None:
        self.closed, self.past, self.conv, self.encoder = True, None, None, None

    def release(self) -> None:
        """The segment ended (or its request did): the memory goes back to the ledger."""
        self.ledger.release(self)


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
    cache: FlowCache | None = field(default=None, repr=False)  # the segment's; a streamed chunk extends it


def _extend(old: np.ndarray | None, new: np.ndarray) -> np.ndarray:
    """Per-layer states [layers, positions, ...] followed by the new positions' (a copy either way)."""
    return np.ascontiguousarray(new) if old is None else np.concatenate([old, new], axis=1)


def segment_token_room(max_frames: int, token_mel_ratio: int, prompt_tokens: int) -> int:
    """Speech tokens one segment may have after a voice's `prompt_tokens`: each flow run covers the prompt and
    the segment's tokens so far, and its fixed noise holds `max_frames` mel frames (upstream indexes past it)."""
    return max_frames // token_mel_ratio - prompt_tokens


def cosine_t_span(n: int) -> np.ndarray:
    t = np.linspace(0.0, 1.0, n + 1, dtype=np.float32)
    return (1.0 - np.cos(t * np.float32(0.5 * math.pi))).astype(np.float32)


class FlowEngine:
    def __init__(self, rt: Runtime, encoder: Path, estimator: Path, spec: FlowSpec, token_mel_ratio: int,
                 noise: np.ndarray, incremental: Path | None = None, cache_limit_bytes: int = 0,
                 incremental_encoder: Path | None = None) -> None:
        self.rt = rt
        self.spec = spec
        self.ratio = token_mel_ratio
        self.encoder = rt.session(encoder, "flow_encoder")
        self._encoder_inputs = {i.name for i in self.encoder.get_inputs()}  # CosyVoice3's takes no `streaming`
        self.estimator = rt.session(estimator, "flow_estimator")
        self.incremental = rt.session(incremental, "flow_incremental") if incremental and spec.incremental else None
        self.ledger = CacheLedger(cache_limit_bytes)
        # Voices' prompt states, least recently used first; touched only by the flow stage's thread.
        self._prompts: OrderedDict[bytes, FlowCache] = OrderedDict()
        self.cfm_step = CFMStep(rt)
        self.t_span = cosine_t_span(spec.n_timesteps)
        self.noise = noise  # [80, max frames]
        if self.incremental is not None:
            shapes = {i.name: i.shape for i in self.incremental.get_inputs()}
            self._layers, self._width = shapes["past"][1], shapes["past"][3]
            self._conv_shape = tuple(shapes["conv_state"][1:])
        self.incremental_encoder = None
        if self.incremental is not None and incremental_encoder is not None and spec.incremental.encoder is not None:
            self.incremental_encoder = rt.session(incremental_encoder, "flow_incremental_encoder")
            shapes = {i.name: i.shape for i in self.incremental_encoder.get_inputs()}
            # token-rate layers, frame-rate layers, keys + values, width, tokens the convolutions look back
            self._enc_shape = (int(shapes["past"][1]), int(shapes["up_past"][1]), int(shapes["past"][3]),
                               *map(int, shapes["up_state"][1:]))

    def new_cache(self) -> FlowCache | None:
        """A streamed segment's cache, or None when the model has no incremental estimator (or no memory is
        allowed for caches)."""
        return FlowCache(self.ledger) if self.incremental is not None and self.ledger.limit > 0 else None

    def cache_bytes_per_frame(self) -> int:
        """Cache bytes one mel frame of a streamed segment (prompt included) holds."""
        if self.incremental is None:
            return 0
        estimator = self.spec.n_timesteps * 2 * int(self._layers) * int(self._width) * 4
        if self.incremental_encoder is None:
            return estimator
        token_layers, frame_layers, kv, _, _ = self._enc_shape
        return estimator + (token_layers * kv * 4) // self.ratio + frame_layers * kv * 4

    @property
    def max_frames(self) -> int:
        return self.noise.shape[1]

    def token_room(self, prompt_tokens: int) -> int:
        return segment_token_room(self.max_frames, self.ratio, prompt_tokens)

    def _settled_frames(self, known_tokens: int) -> int:
        """Frames that no later masked run of a segment changes, when its first `known_tokens` tokens and their
        look-ahead tokens are final: those of complete chunks of both the encoder (tokens) and the estimator
        (frames)."""
        inc: IncrementalEstimator = self.spec.incremental  # type: ignore[assignment]
        enc = inc.encoder_chunk_tokens or 1
        tokens = max(known_tokens, 0) // enc * enc
        return tokens * self.ratio // inc.chunk_frames * inc.chunk_frames

    def _settled(self, c: FlowChunk) -> int:
        """Frames of a masked run that no later masked run of the segment changes (its context tokens are the
        look-ahead of its last tokens)."""
        return self._settled_frames(c.token_len - max(self.spec.pre_lookahead_tokens - c.context_len, 0))

    def prompt_frames(self, prompt_tokens: int) -> int:
        """Frames of a voice's prompt that every streamed segment's masked runs compute alike: those of complete
        encoder chunks whose look-ahead tokens are the prompt's own, in complete estimator chunks (they depend
        on the prompt's tokens and mel, the speaker embedding and the fixed noise only)."""
        if self.spec.incremental is None:
            return 0
        return self._settled_frames(prompt_tokens - self.spec.pre_lookahead_tokens)

    def _encoder_tokens(self, frames: int) -> int:
        """Tokens whose encoder states a cache of `frames` settled frames keeps: whole encoder chunks, so a
        later run's new encoder output starts at or before its estimator's first new frame."""
        enc = self.spec.incremental.encoder_chunk_tokens  # type: ignore[union-attr]
        return frames // self.ratio // enc * enc

    @property
    def prompt_cache_bytes(self) -> int:
        return sum(p.counted for p in list(self._prompts.values()))

    def _prompt_states(self, c: FlowChunk) -> FlowCache | None:
        """The voice's prompt states, computed by its first streamed segment and kept for the next ones (at
        most a quarter of the cache memory, least recently used voices dropped first)."""
        prompt_tokens = c.prompt_frames // self.ratio
        frames = self.prompt_frames(prompt_tokens)
        need = frames * self.cache_bytes_per_frame()
        if not frames or need > self.ledger.limit // 4:
            return None
        key = hashlib.blake2b(b"".join(np.ascontiguousarray(a).tobytes() for a in (
            c.tokens[:prompt_tokens], c.embedding.astype(np.float32), c.prompt_mel.astype(np.float32)))).digest()
        if (hit := self._prompts.get(key)) is not None and not hit.closed:
            self._prompts.move_to_end(key)
            return hit
        if self.ledger.used + need > self.ledger.limit:
            return None  # no room now: the segment computes the prompt's frames itself, as without states
        states = FlowCache(self.ledger)
        prompt = FlowChunk(tokens=c.tokens[:prompt_tokens], token_len=prompt_tokens, context_len=0, streaming=True,
                           prompt_frames=c.prompt_frames, offset_frames=0, embedding=c.embedding,
                           prompt_mel=c.prompt_mel, cache=states)
        self._run_incremental([prompt], settled=[frames])
        if states.closed:
            return None
        self._prompts[key] = states
        while self.prompt_cache_bytes > self.ledger.limit // 4:
            self._prompts.popitem(last=False)[1].release()
        return states if not states.closed else None

    def _seed(self, c: FlowChunk) -> None:
        """A segment's first streamed chunk starts from its voice's prompt states: it computes only the frames
        after them. The arrays are shared; the segment's first store replaces them with its own."""
        cache = c.cache
        if cache is None or cache.frames or cache.closed:
            return
        states = self._prompt_states(c)
        if states is not None:
            cache.past, cache.conv, cache.frames, cache.encoder = states.past, states.conv, states.frames, states.encoder

    def run(self, chunks: list[FlowChunk]) -> list[np.ndarray]:
        inc = [i for i, c in enumerate(chunks)
               if self.incremental is not None and c.streaming and c.cache is not None and not c.cache.closed]
        for i in inc:
            self._seed(chunks[i])
        full = [i for i in range(len(chunks)) if i not in inc]
        out: list[np.ndarray | None] = [None] * len(chunks)
        for rows, fn in ((full, self._run_full), (inc, self._run_incremental)):
            if rows:
                for i, mel in zip(rows, fn([chunks[i] for i in rows])):
                    out[i] = mel
        for c in chunks:
            if not c.streaming and c.cache is not None:
                c.cache.release()  # upstream's finalize: the segment's last run, without masks
        return out  # type: ignore[return-value]

    def _encode(self, chunks: list[FlowChunk]) -> tuple[np.ndarray, np.ndarray]:
        b = len(chunks)
        n = max(len(c.tokens) for c in chunks)
        tokens = np.zeros((b, n), np.int64)
        for i, c in enumerate(chunks):
            tokens[i, : len(c.tokens)] = c.tokens
        lens = np.array([c.token_len for c in chunks], np.int64)
        emb = np.stack([c.embedding for c in chunks]).astype(np.float32)
        streaming = np.array([int(c.streaming) for c in chunks], np.int64)
        feed = {"token": tokens, "token_len": lens, "context_len": np.array([c.context_len for c in chunks], np.int64),
                "streaming": streaming, "embedding": emb}
        frames = self._frames(chunks)
        mu, spks = self.encoder.run(["mu", "spks"], {k: v for k, v in feed.items() if k in self._encoder_inputs})
        return mu[:, :, :frames], spks

    def _frames(self, chunks: list[FlowChunk]) -> int:
        """The longest row's mel frames, which the fixed noise must cover."""
        frames = max(c.token_len for c in chunks) * self.ratio
        if frames > self.max_frames:
            raise ValueError(f"{frames} mel frames exceed the flow noise buffer ({self.max_frames})")
        return frames

    def _encode_new(self, chunks: list[FlowChunk], settled: list[int]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[EncoderStates | None]]:
        """mu from each row's first frame after its cache's encoder states (frame 0 without an incremental
        encoder: the whole prefix), that frame, spks, and the encoder states to keep with `settled` frames."""
        b = len(chunks)
        if self.incremental_encoder is None:
            mu, spks = self._encode(chunks)
            return mu, spks, np.zeros(b, np.int64), [None] * b
        self._frames(chunks)
        had = [c.cache.encoder for c in chunks]  # type: ignore[union-attr]
        offset = np.array([s.tokens if s is not None else 0 for s in had], np.int64)
        keep = np.array([self._encoder_tokens(f) for f in settled], np.int64)
        commit = np.maximum(keep - offset, 0)
        mu, spks, new_past, new_up_past, new_up_state = self.incremental_encoder.run(
            None, self._encoder_feed(chunks, had, offset) | {"commit": commit})
        kept = [s if not k else EncoderStates(int(keep[i]), _extend(None if s is None else s.past, new_past[i, :, :k]),
                                              _extend(None if s is None else s.up_past, new_up_past[i, :, : k * self.ratio]),
                                              new_up_state[i].copy())
                for i, (s, k) in enumerate(zip(had, commit))]
        return mu, spks, offset * self.ratio, kept

    def _encoder_feed(self, chunks: list[FlowChunk], had: list[EncoderStates | None], offset: np.ndarray) -> dict:
        """The incremental encoder's inputs but `commit`: each row's tokens from `left` before its offset (padding
        before token 0) and its states, padded to the batch's longest."""
        token_layers, frame_layers, kv, width, left = self._enc_shape
        b = len(chunks)
        tokens = np.zeros((b, max(left + len(c.tokens) - int(o) for c, o in zip(chunks, offset))), np.int64)
        for i, (c, o) in enumerate(zip(chunks, offset)):
            first = max(int(o) - left, 0)
            pad = left - (int(o) - first)
            tokens[i, pad : pad + len(c.tokens) - first] = c.tokens[first:]
        tp = int(offset.max())
        if b == 1 and tp:  # its states are the inputs as they are: no copy
            past, up_past, up_state = had[0].past[None], had[0].up_past[None], had[0].up_state[None]  # type: ignore[union-attr]
        else:
            past = np.zeros((b, token_layers, tp, kv), np.float32)
            up_past = np.zeros((b, frame_layers, tp * self.ratio, kv), np.float32)
            up_state = np.zeros((b, width, left), np.float32)
            for i, s in enumerate(had):
                if s is not None:
                    past[i, :, : s.tokens], up_past[i, :, : s.tokens * self.ratio], up_state[i] = s.past, s.up_past, s.up_state
        return {"token": tokens, "token_len": np.array([c.token_len for c in chunks], np.int64),
                "context_len": np.array([c.context_len for c in chunks], np.int64), "offset": offset,
                "embedding": np.stack([c.embedding for c in chunks]).astype(np.float32), "past": past,
                "up_past": up_past, "up_state": up_state}

    def _run_full(self, chunks: list[FlowChunk]) -> list[np.ndarray]:
        """Every frame of every row, as upstream's flow.inference computes them."""
        mu, spks = self._encode(chunks)
        b = len(chunks)
        frames = max(c.token_len for c in chunks) * self.ratio
        mu = np.ascontiguousarray(mu[:, :, :frames])
        streaming = np.array([int(c.streaming) for c in chunks], np.int64)
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

    def _run_incremental(self, chunks: list[FlowChunk], settled: list[int] | None = None) -> list[np.ndarray]:
        """Masked runs over the frames after each segment's cache; the same mel as _run_full's. The caches grow
        to `settled` frames (default: every frame no later masked run changes)."""
        b = len(chunks)
        start = np.array([c.cache.frames for c in chunks], np.int64)  # type: ignore[union-attr]
        end = np.array([c.token_len * self.ratio for c in chunks], np.int64)
        settled = settled if settled is not None else [self._settled(c) for c in chunks]
        mu, spks, mu_start, encoder = self._encode_new(chunks, settled)
        commit = np.maximum(np.array(settled, np.int64) - start, 0)
        n, p = int((end - start).max()), int(start.max())
        mask = np.zeros((b, 1, n), np.float32)
        cond = np.zeros((b, 80, n), np.float32)
        x = np.zeros((b, 80, n), np.float32)
        mu_new = np.zeros((b, 80, n), np.float32)
        for i, c in enumerate(chunks):
            s, e = int(start[i]), int(end[i])
            mask[i, 0, : e - s] = 1.0
            x[i, :, : e - s] = self.noise[:, s:e]
            mu_new[i, :, : e - s] = mu[i, :, s - mu_start[i] : e - mu_start[i]]
            if s < c.prompt_frames:
                cond[i, :, : c.prompt_frames - s] = c.prompt_mel[s:].T
        zeros = np.zeros_like
        feed = {"mask": np.concatenate([mask, mask]), "mu": np.concatenate([mu_new, zeros(mu_new)]),
                "spks": np.concatenate([spks, zeros(spks)]).astype(np.float32), "cond": np.concatenate([cond, zeros(cond)]),
                "offset": np.concatenate([start, start]), "commit": np.concatenate([commit, commit])}
        cfg = np.float32(self.spec.cfg_rate)
        caches: list[FlowCache] = [c.cache for c in chunks]  # type: ignore[misc]
        # Each row's cache after this run, [steps, 2, layers, frames, width]: its old frames, then the new
        # ones of complete chunks, written step by step as the estimator returns them.
        grown = [np.empty((self.spec.n_timesteps, 2, self._layers, int(start[i] + commit[i]), self._width), np.float32)
                 for i in range(b)]
        for i, cache in enumerate(caches):
            if cache.frames:
                grown[i][:, :, :, : cache.frames] = cache.past  # type: ignore[index]
        convs = np.empty((self.spec.n_timesteps, 2 * b, *self._conv_shape), np.float32)
        alone = b == 1 and caches[0].frames > 0  # its cache is the past input as it is: no copy
        past = np.zeros((2 * b, self._layers, 0 if alone else p, self._width), np.float32)
        conv = np.zeros((2 * b, *self._conv_shape), np.float32)
        for k in range(self.spec.n_timesteps):
            if alone:
                past = caches[0].past[k]  # type: ignore[index]
            for i, cache in enumerate(caches):
                if cache.frames and not alone:
                    past[i, :, : cache.frames], past[b + i, :, : cache.frames] = cache.past[k]  # type: ignore[index]
                if cache.frames:
                    conv[i], conv[b + i] = cache.conv[k]  # type: ignore[index]
            t0, t1 = self.t_span[k], self.t_span[k + 1]
            v, step_past, convs[k] = self.incremental.run(None, feed | {  # type: ignore[union-attr]
                "x": np.concatenate([x, x]), "t": np.full(2 * b, t0, np.float32), "past": past, "conv_state": conv})
            # The CFM step graph's arithmetic, in its order: x + ((1 + cfg) v_cond - cfg v_uncond) dt.
            x = x + (v[:b] * (cfg + np.float32(1.0)) - v[b:] * cfg) * np.float32(t1 - t0)
            for i in range(b):
                f, n_new = int(start[i]), int(commit[i])
                grown[i][k, 0, :, f:] = step_past[i, :, :n_new]
                grown[i][k, 1, :, f:] = step_past[b + i, :, :n_new]
        for i, cache in enumerate(caches):
            if commit[i]:
                cache.ledger.store(cache, grown[i], np.ascontiguousarray(convs[:, [i, b + i]]), int(start[i] + commit[i]),
                                   encoder[i])
        return [x[i, :, c.prompt_frames + c.offset_frames - int(start[i]) : int(end[i] - start[i])].copy()
                for i, c in enumerate(chunks)]


@dataclass
class VocoderInput:
    mel: np.ndarray  # [80, frames]
    noise: np.ndarray  # [frames * hop, harmonics]: the source module's noise
    cache_source: np.ndarray | None  # [cached samples]: replaces the head of the source signal (crossfade seams)


class VocoderEngine:
    def __init__(self, rt: Runtime, path: Path, hop_samples: int, fixed_noise: np.ndarray | None = None) -> None:
        """`fixed_noise` [samples, harmonics]: a causal vocoder's source noise, read from sample 0 by every run
        (the graph then takes no cache_source); None: Gaussian noise per request, drawn by `noise`."""
        self.session = rt.session(path, "vocoder")
        self.hop = hop_samples
        self.fixed_noise = fixed_noise
        noise = next(i for i in self.session.get_inputs() if i.name == "noise")
        self.harmonics = int(noise.shape[-1])

    @property
    def max_frames(self) -> int | None:
        """The most mel frames one run may take (a fixed noise's length), None without a bound."""
        return None if self.fixed_noise is None else len(self.fixed_noise) // self.hop

    def noise(self, frames: int, rng: np.random.Generator) -> np.ndarray:
        samples = frames * self.hop
        if self.fixed_noise is not None:
            if samples > len(self.fixed_noise):
                raise ValueError(f"{frames} mel frames exceed the vocoder's noise ({len(self.fixed_noise) // self.hop})")
            return np.asarray(self.fixed_noise[:samples])
        return rng.standard_normal((samples, self.harmonics), np.float32)

    def run(self, items: list[VocoderInput]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """(waveform, source) per item (source None for a causal vocoder); items of equal length (and cache)
        run as one batch."""
        out: list[tuple[np.ndarray, np.ndarray | None] | None] = [None] * len(items)
        groups: dict[tuple[int, int | None], list[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault((it.mel.shape[1], None if it.cache_source is None else len(it.cache_source)), []).append(i)
        for (_, cached), idx in groups.items():
            feed = {"speech_feat": np.stack([items[i].mel for i in idx]).astype(np.float32),
                    "noise": np.stack([items[i].noise for i in idx]).astype(np.float32)}
            if cached is None:
                (wav,) = self.session.run(["waveform"], feed)
                source = [None] * len(idx)
            else:
                feed["cache_source"] = np.stack([items[i].cache_source for i in idx]).astype(np.float32)[:, None, :]
                wav, sources = self.session.run(["waveform", "source"], feed)
                source = [sources[j, 0] for j in range(len(idx))]
            for j, i in enumerate(idx):
                out[i] = (wav[j], source[j])
        return out  # type: ignore[return-value]
