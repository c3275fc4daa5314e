"""Per-request chunking and seam stitching for streamed synthesis.

As CosyVoice2 does, the first chunk is cut after `first_hop_tokens` (+ the flow's pre-lookahead),
and each later hop doubles up to `max_hop_tokens`. Unlike upstream (issue #1798), the hop lives in
the request's own planner and is never shared between requests.

Seams: each chunk is vocoded together with the last few mel frames of the previous chunk; the audio
of those frames is produced twice and cross-faded with a raised-cosine window, so the stream has no
clicks and its total length is exactly tokens x samples_per_token / speed.
"""

from __future__ import annotations

import numpy as np


class ChunkPlanner:
    def __init__(self, first_hop: int, max_hop: int, lookahead: int) -> None:
        self.offset = 0
        self.hop = first_hop
        self.max_hop = max_hop
        self.lookahead = lookahead

    def next(self, available: int, finished: bool) -> tuple[int, int] | None:
        """Token range [start, end) of the next chunk, or None when it must wait for more tokens."""
        if finished:
            if available > self.offset:
                start, self.offset = self.offset, available
                return start, available
            return None
        if available >= self.offset + self.hop + self.lookahead:
            start, self.offset = self.offset, self.offset + self.hop
            self.hop = min(self.hop * 2, self.max_hop)
            return start, self.offset
        return None


def stretch_mel(mel: np.ndarray, speed: float) -> np.ndarray:
    """Time-scales mel[80, F] by 1/speed (linear interpolation), as CosyVoice does for `speed`."""
    if speed == 1.0:
        return mel
    frames = max(1, int(round(mel.shape[1] / speed)))
    src = np.linspace(0, mel.shape[1] - 1, frames)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, mel.shape[1] - 1)
    w = (src - lo).astype(np.float32)
    return (mel[:, lo] * (1 - w) + mel[:, hi] * w).astype(np.float32)


class Stitcher:
    """Turns vocoded chunks (each starting with `context` samples that repeat the previous chunk's
    held-back tail) into a seamless sample stream."""

    def __init__(self, overlap_samples: int) -> None:
        self.overlap = overlap_samples
        self.held = np.zeros(0, np.float32)

    def push(self, audio: np.ndarray, context: int, final: bool) -> np.ndarray:
        if context:
            fade_in = np.sin(np.linspace(0, np.pi / 2, context, dtype=np.float32)) ** 2
            head = self.held[-context:] * (1 - fade_in) + audio[:context] * fade_in
            out = [self.held[:-context], head, audio[context:]]
        else:
            out = [self.held, audio]
        stream = np.concatenate(out)
        if final:
            self.held = np.zeros(0, np.float32)
            return stream
        keep = min(self.overlap, len(audio) - context)
        self.held = stream[len(stream) - keep :]
        return stream[: len(stream) - keep]
