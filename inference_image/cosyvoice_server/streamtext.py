"""Text tokens from text that arrives in pieces, the same whatever the pieces.

Upstream's bistream frontend tokenizes each delta on its own, so "Hel" + "lo" gives other tokens than
"Hello" (and a special token such as "[breath]" split across deltas is lost). Here text tokens are
committed only up to a boundary that later text cannot move: the start of the last pre-tokenizer piece of
the text held back (a word being typed may still grow), and never inside, or at a possible start of, one
of the tokenizer's added tokens. A byte-level BPE tokenizes each pre-tokenizer piece on its own, so the
committed tokens, concatenated, are the tokens of the whole text. `flush` commits the rest.

Cleaning is split-independent too: control characters become spaces, format characters (Cf) go,
whitespace runs one space, the segment's leading and trailing whitespace dropped, and the tokenizer's
own normalizer (NFC for Qwen2) applied to the held-back text as a whole. Like upstream's streamed input
(which skips `text_normalize`), there is no wetext normalization or sentence split: those need whole
sentences, which would delay the first audio until a sentence ends.

A run of letters without spaces or punctuation (Chinese, Japanese) is one pre-tokenizer piece, so it is
committed when punctuation or a space follows it, or at a flush. A piece longer than `RUN_CHARS` is committed
in runs of that many characters from its start as it grows (and cut the same way when it arrives whole), so
the text held back, the work per delta and the wait for a long unpunctuated run's first audio stay bounded
whatever a client sends; only such runs' tokens differ from the whole text's, at each run's end.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from .frontend import _EN_STOPS, _SPACE, _ZH_STOPS, clean  # the whole-text path's cleaning and sentence ends


# Longer than any word a dictionary lists; an unpunctuated CJK run this long is several seconds of speech.
RUN_CHARS = 64
DELTA_SLICE = 2048  # characters tokenized per call: a few milliseconds


class StreamTokenizer:
    """One session's text in, text tokens out (not thread-safe: its owner serialises calls)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self._added_ids = set(added)
        self._added = sorted({t.content for t in added.values() if t.content})
        self._held = ""  # cleaned text not yet committed
        self._fresh = True  # nothing committed since the segment started: leading whitespace is dropped

    @property
    def held(self) -> str:
        return self._held

    def _normalize(self, text: str) -> str:
        n = self.tok.normalizer
        return n.normalize_str(text) if n is not None else text

    def _encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids if text else []

    def _added_spans(self, text: str) -> list[tuple[int, int]]:
        """Where the tokenizer's added tokens are in `text` (it matches them before pre-tokenizing)."""
        enc = self.tok.encode(text, add_special_tokens=False)
        return [(a, b) for tid, (a, b) in zip(enc.ids, enc.offsets) if tid in self._added_ids]

    def _pieces(self, text: str, added: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The pre-tokenizer's pieces of `text` as (start, end), between its added tokens."""
        spans, pos = [], 0
        for a, b in [*added, (len(text), len(text))]:
            if a > pos:
                part = text[pos:a]
                found = self.tok.pre_tokenizer.pre_tokenize_str(part) if self.tok.pre_tokenizer else [(part, (0, len(part)))]
                spans += [(pos + x, pos + y) for _, (x, y) in found]
            pos = max(pos, b)
        return spans

    def _cut(self, text: str, added: list[tuple[int, int]], pieces: list[tuple[int, int]]) -> int:
        """The longest prefix of `text` whose tokens no continuation can change."""
        tail_start = added[-1][1] if added else 0  # text after the last added token is pre-tokenized on its own
        if added and tail_start == len(text):
            cut = added[-1][0]  # an added token at the very end is held too (a longer one may start the same way)
        elif self.tok.pre_tokenizer is None:
            cut = len(text)
        else:  # the start of the last piece: a word being typed may still grow
            cut = max((a for a, _ in pieces if a >= tail_start), default=len(text))
        # Never commit the start of what may become an added token: "[bre" could still be "[breath]".
        for i in range(max(tail_start, len(text) - max((len(a) for a in self._added), default=0)), len(text)):
            rest = text[i:]
            if any(a.startswith(rest) and a != rest for a in self._added):
                return min(cut, i)
        return cut

    def push(self, delta: str) -> list[int]:
        """Adds a text delta; returns the text tokens it commits (often none while a word is typed). A long
        delta goes in slices (the same tokens, whatever the split) so that no call into the tokenizer holds
        the interpreter for long: the event loop gets its turns while a 64 KiB message is tokenized."""
        return [t for i in range(0, max(len(delta), 1), DELTA_SLICE) for t in self._push(delta[i:i + DELTA_SLICE])]

    def _push(self, delta: str) -> list[int]:
        text = _SPACE.sub(" ", self._held + clean(delta))
        if self._fresh:
            text = text.lstrip()
        text = self._normalize(text)
        added = self._added_spans(text)
        pieces = self._pieces(text, added)
        # A piece longer than RUN_CHARS is cut every RUN_CHARS characters from its start, leaving 1..RUN_CHARS
        # (a growing piece only adds cuts).
        runs = [c for a, b in pieces for c in range(a + RUN_CHARS, b, RUN_CHARS)]
        cut = max(self._cut(text, added, pieces), runs[-1] if runs else 0)
        self._held = text[cut:]
        if cut:
            self._fresh = False
        bounds = [0, *(c for c in runs if c < cut), cut]
        return [t for a, b in zip(bounds, bounds[1:]) for t in self._encode(text[a:b])]

    def sentence_break(self, before: list[int], nxt: int) -> bool:
        """A sentence ends between `before` and `nxt`: sentence punctuation (quotes and brackets may close
        after it), then a space for ASCII punctuation ("3.5" and "e.g.x" go on). The last four tokens are
        decoded together: a byte-level token may hold only part of a character such as "。"."""
        end = self.tok.decode(before[-4:]).rstrip("\"”'’)]）」")
        if end.endswith(tuple(_ZH_STOPS.translate(str.maketrans("", "", _EN_STOPS)))):
            return True
        return end.endswith(tuple(_EN_STOPS)) and self.tok.decode([nxt])[:1].isspace()

    def flush(self) -> list[int]:
        """Commits everything held; the next text starts a new segment."""
        text = self._held.rstrip()
        self._held, self._fresh = "", True
        return self._encode(text)

