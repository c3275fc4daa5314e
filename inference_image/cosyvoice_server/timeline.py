"""Where a request's segments and pauses fall in its audio, counted in samples as the audio goes out.

The scheduler marks the end of each LLM segment's audio (`SegmentEnd`); a pause (an SSML break) is silence
put in place after the segment before it (or before the first). Each spoken segment and each pause is
reported with its text (empty for a pause) and its `start_s` and `end_s`, from the samples sent before and
through it: the reported segments tile the audio, and their lengths add up to it exactly. A segment the
frontend had to cut at its token limit is reported once, with the pieces' audio together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .frontend import Spoken
from .pronunciation.plan import Pause


@dataclass
class Timeline:
    items: list[Spoken | Pause]  # the plan's segments and pauses, in order
    sample_rate: int

    def __post_init__(self) -> None:
        self.spoken = [i for i in self.items if isinstance(i, Spoken)]
        self.samples = 0  # sent so far
        self._start = 0  # where the open segment began
        self._next = 0  # index into items of what comes next

    def _event(self, text: str, start: int) -> dict:
        return {"text": text, "start_s": start / self.sample_rate, "end_s": self.samples / self.sample_rate}

    def _pauses(self) -> tuple[np.ndarray, list[dict]]:
        """The pauses that come next (before the next spoken segment), as silence and their events."""
        audio, events = [], []
        while self._next < len(self.items) and isinstance(pause := self.items[self._next], Pause):
            n = round(pause.seconds * self.sample_rate)
            start, self.samples = self.samples, self.samples + n
            audio.append(np.zeros(n, np.float32))
            events.append(self._event("", start))
            self._next += 1
        self._start = self.samples
        return (np.concatenate(audio) if audio else np.zeros(0, np.float32)), events

    def begin(self) -> tuple[np.ndarray, list[dict]]:
        """Silence before the first segment (a leading break), before any audio."""
        return self._pauses()

    def audio(self, n: int) -> None:
        self.samples += n

    def segment_end(self) -> tuple[np.ndarray, list[dict]]:
        """A segment's audio is all out: its event (unless the next piece continues it), then the pauses after it."""
        seg = self.items[self._next]
        first = self._next
        while first > 0 and isinstance(self.items[first], Spoken) and self.items[first].continued:
            first -= 1
        self._next += 1
        nxt = self.items[self._next] if self._next < len(self.items) else None
        if isinstance(nxt, Spoken) and nxt.continued:
            return np.zeros(0, np.float32), []
        events = [self._event(self.items[first].text if isinstance(seg, Spoken) else "", self._start)]
        silence, pauses = self._pauses()
        return silence, events + pauses
