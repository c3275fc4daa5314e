"""Text frontend: normalization, tokenization and segmentation.

CosyVoice2 feeds the LLM at most a sentence or two at a time; long inputs are split at sentence
punctuation into segments of at most `max_text_tokens_per_segment` tokens, synthesized one after
another into one audio stream.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

_SPACE = re.compile(r"\s+")
_CONTROL = re.compile(r"[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]")
# Split after sentence-final punctuation (Latin and CJK), keeping it with its sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?;。！？；…])\s*")


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = _CONTROL.sub(" ", text)
    return _SPACE.sub(" ", text).strip()


class TextFrontend:
    def __init__(self, tokenizer_path: Path, max_tokens_per_segment: int) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.max_tokens = max_tokens_per_segment

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def segments(self, text: str) -> list[np.ndarray]:
        """Normalized text as token-id arrays, each at most max_tokens long, split at sentence ends
        where possible and packed greedily so short sentences share a segment."""
        out: list[list[int]] = []
        current: list[int] = []
        for sentence in filter(None, _SENTENCE_END.split(normalize(text))):
            ids = self.encode(sentence if not current else " " + sentence)
            if current and len(current) + len(ids) > self.max_tokens:
                out.append(current)
                current = []
                ids = self.encode(sentence)
            current.extend(ids)
            while len(current) > self.max_tokens:
                out.append(current[: self.max_tokens])
                current = current[self.max_tokens :]
        if current:
            out.append(current)
        return [np.asarray(s, dtype=np.int64) for s in out]
