"""Per-request chunking and vocoder seams, as upstream CosyVoice2Model (`cli/model.py`, `tts` and
`token2wav`) does them.

Chunks: each text segment is one upstream `tts` call. While streaming, a chunk is cut once the
segment has `hop + pre_lookahead` tokens past the offset; the first hop of a segment is padded by
`prompt_token_pad` so chunk boundaries align with the flow's attention chunks; the hop then grows by
`hop_growth` up to `max_hop`. Each chunk re-runs the flow over all tokens so far (the flow's output for
earlier tokens depends on later ones only through the lookahead), and the segment ends with one
final chunk over all its tokens with streaming masks off. Upstream keeps the hop on the shared model,
so later requests start with long hops (its issue #1798); here the hop belongs to the request.

Seams, as the model's manifest says (`streaming.seams`):
- crossfade (CosyVoice2Model.token2wav): the vocoder re-runs the last `mel_cache` frames of the previous
  chunk, with the previous chunk's source signal for them; the audio of those frames is cross-faded with the
  previous chunk's held-back tail by a Hamming window and the new tail is held back until the next chunk.
- causal (CosyVoice3Model.token2wav): the vocoder is causal but for a look-right; each chunk vocodes the
  segment's mel so far and sends the audio past what was sent, less the last `look_right` frames' worth
  (their samples still depend on frames to come), which the next chunk sends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def drop_silence(tokens: list[int], run: int, silent: frozenset[int], max_run: int) -> tuple[list[int], int]:
    """Upstream CosyVoice3Model.llm_job: a silent token past `max_run` in a row stays out of the flow's tokens
    (the LLM still had it). `run`: the silent tokens in a row before `tokens`; returns the kept ones and the
    new run."""
    kept = []
    for t in tokens:
        run = run + 1 if t in silent else 0
        if run <= max_run:
            kept.append(t)
    return kept, run


@dataclass(frozen=True)
class Span:
    offset: int  # tokens of this segment already returned
    end: int  # tokens returned once this chunk is done
    final: bool  # finalize: all tokens, no context, streaming masks off


class ChunkPlanner:
    def __init__(self, first_hop: int, max_hop: int, growth: int, lookahead: int, prompt_tokens: int, stream: bool) -> None:
        self.first_hop = self.hop = first_hop
        self.max_hop = max_hop
        self.growth = growth
        self.lookahead = lookahead
        self.prompt_tokens = prompt_tokens
        self.stream = stream
        self.new_segment()

    def new_segment(self, restart_hop: bool = False) -> None:
        """Within a request the hop keeps growing, as upstream's does; a streamed-text session restarts it
        for each segment, so the audio of a new thought starts as soon as the first one's did."""
        if restart_hop:
            self.hop = self.first_hop
        self.offset = 0
        self.ended = False
        self.pad = math.ceil(self.prompt_tokens / self.hop) * self.hop - self.prompt_tokens

    def next(self, available: int, finished: bool) -> Span | None:
        """The next chunk of the current segment, or None until more tokens (or its end) arrive."""
        if self.ended:
            return None
        if self.stream:
            hop = self.hop + self.pad if self.offset == 0 else self.hop
            if available - self.offset >= hop + self.lookahead:
                span = Span(self.offset, self.offset + hop, False)
                self.offset += hop
                self.hop = min(self.max_hop, self.hop * self.growth)
                return span
        if finished:
            self.ended = True
            return Span(self.offset, available, True)
        return None


def interpolate_mel(mel: np.ndarray, speed: float) -> np.ndarray:
    """F.interpolate(mel[None], size=int(T / speed), mode='linear') with torch's float32 index math (and
    never fewer than one frame, where upstream would fail on an empty size)."""
    t = mel.shape[1]
    size = max(1, int(t / speed))
    if speed == 1.0 or size == t:
        return mel
    scale = np.float32(t) / np.float32(size)
    src = np.maximum(scale * (np.arange(size, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5), np.float32(0))
    i0 = src.astype(np.int64)
    lam = np.clip(src - i0.astype(np.float32), 0, 1).astype(np.float32)
    i1 = np.minimum(i0 + 1, t - 1)
    return (mel[:, i0] * (np.float32(1) - lam) + mel[:, i1] * lam).astype(np.float32)


@dataclass
class HiftCache:
    mel: np.ndarray  # [80, mel_cache] last frames of the previous chunk's vocoder input
    source: np.ndarray  # [mel_cache * hop] their source signal
    speech: np.ndarray  # [mel_cache * hop] their audio, held back


def fade_in_out(speech: np.ndarray, previous: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Upstream's `fade_in_out`: the head of the new audio fades in over the held-back tail (float64 window)."""
    n = len(window) // 2
    out = speech.copy()
    out[:n] = (speech[:n] * window[:n] + previous[-n:] * window[n:]).astype(np.float32)
    return out


def seam(speech: np.ndarray, source: np.ndarray, vocoded_mel: np.ndarray, cache: HiftCache | None, final: bool,
         mel_cache: int, hop: int, window: np.ndarray) -> tuple[np.ndarray, HiftCache | None]:
    """Audio to send for one vocoded chunk and the cache for the next (None after a segment's final chunk)."""
    if cache is not None:
        speech = fade_in_out(speech, cache.speech, window)
    if final:
        return speech, None
    keep = mel_cache * hop
    return speech[:-keep], HiftCache(vocoded_mel[:, -mel_cache:], source[-keep:], speech[-keep:])


@dataclass
class VocodedSoFar:
    """A streamed segment's mel so far and the samples of its audio already sent (causal seams)."""

    mel: np.ndarray  # [80, frames]
    sent: int


SeamState = HiftCache | VocodedSoFar | None


@dataclass(frozen=True)
class CrossfadeSeams:
    mel_cache: int
    hop: int

    @property
    def window(self) -> np.ndarray:
        return np.hamming(2 * self.mel_cache * self.hop)  # upstream's speech_window

    def mel(self, state: SeamState, mel: np.ndarray, final: bool, speed: float) -> tuple[np.ndarray, np.ndarray | None]:
        """The mel to vocode for a chunk and the source signal its head takes over (cached frames first;
        `speed` stretches whole segments only)."""
        if isinstance(state, HiftCache):
            return np.concatenate([state.mel, mel], axis=1), state.source
        return (interpolate_mel(mel, speed) if final else mel), np.zeros(0, np.float32)

    def audio(self, state: SeamState, wav: np.ndarray, source: np.ndarray | None, vocoded: np.ndarray,
              final: bool) -> tuple[np.ndarray, SeamState]:
        return seam(wav, source, vocoded, state if isinstance(state, HiftCache) else None, final, self.mel_cache,
                    self.hop, self.window)


@dataclass(frozen=True)
class CausalSeams:
    look_right: int
    hop: int

    def mel(self, state: SeamState, mel: np.ndarray, final: bool, speed: float) -> tuple[np.ndarray, None]:
        if isinstance(state, VocodedSoFar):
            return np.concatenate([state.mel, mel], axis=1), None
        return (interpolate_mel(mel, speed) if final else mel), None

    def audio(self, state: SeamState, wav: np.ndarray, source: np.ndarray | None, vocoded: np.ndarray,
              final: bool) -> tuple[np.ndarray, SeamState]:
        sent = state.sent if isinstance(state, VocodedSoFar) else 0
        if final:
            return wav[sent:], None
        ready = max(sent, (vocoded.shape[1] - self.look_right) * self.hop)
        return wav[sent:ready], VocodedSoFar(vocoded, ready)


def seams_of(kind: str, mel_cache: int, look_right: int, hop: int) -> CrossfadeSeams | CausalSeams:
    return CausalSeams(look_right, hop) if kind == "causal" else CrossfadeSeams(mel_cache, hop)
