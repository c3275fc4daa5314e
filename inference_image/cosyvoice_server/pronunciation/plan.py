"""What a request says, before normalization: spoken parts (each one or more LLM segments) and pauses.

A `Part` is text in runs: plain text, which the frontend normalizes as it normalizes any input, and
verbatim runs (the model's phone markup), which it never touches. Lexicons act here: an alias replaces its
grapheme in the text (so it is normalized and tokenized exactly as if the text had said it), a phoneme
becomes a verbatim run that shows as its grapheme in segment texts.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from .lexicon import Matcher
from .phones import PhoneSet, PronunciationError


@dataclass(frozen=True)
class Run:
    text: str
    verbatim: bool = False  # the model's markup: not normalized, not matched
    shown: str = ""  # what a verbatim run stands for in a segment's reported text


@dataclass(frozen=True)
class Part:
    runs: tuple[Run, ...]
    speed: float = 1.0


@dataclass(frozen=True)
class Pause:
    seconds: float


Plan = list[Part | Pause]


def merged(runs: list[Run]) -> tuple[Run, ...]:
    """Adjacent plain runs joined, empty ones dropped."""
    out: list[Run] = []
    for r in runs:
        if not r.text:
            continue
        if out and not r.verbatim and not out[-1].verbatim:
            out[-1] = Run(out[-1].text + r.text)
        else:
            out.append(r)
    return tuple(out)


def apply_lexicons(text: str, matcher: Matcher | None, phones: PhoneSet) -> list[Run]:
    """`text` with the matcher's graphemes replaced; PronunciationError names the lexeme a model cannot say."""
    if matcher is None or not matcher.rules:
        return [Run(text)]
    text = unicodedata.normalize("NFC", text)
    runs, pos = [], 0
    for m in matcher.matches(text):
        runs.append(Run(text[pos:m.start]))
        runs.append(rule_run(m.rule, text[m.start:m.end], phones))
        pos = m.end
    runs.append(Run(text[pos:]))
    return runs


def rule_run(rule, matched: str, phones: PhoneSet) -> Run:
    if rule.kind == "alias":
        return Run(rule.value)
    try:
        return Run(phones.markup(rule.alphabet, rule.value), verbatim=True, shown=matched)
    except PronunciationError as exc:
        raise PronunciationError(f"the lexeme '{rule.lexeme}' has a phoneme this model cannot say: {exc}") from None


def plain(text: str, matcher: Matcher | None, phones: PhoneSet, speed: float = 1.0) -> Plan:
    """Plain text input: one part."""
    return [Part(merged(apply_lexicons(text, matcher, phones)), speed)]


class StreamLexicon:
    """Lexicons over text that arrives in pieces (a WebSocket session): the same runs as `apply_lexicons` on the
    whole text, whatever the pieces. The last `longest grapheme` characters are held back, since a later piece
    could still make them part of a match or extend a word; `flush` releases them."""

    def __init__(self, matcher: Matcher | None, phones: PhoneSet) -> None:
        self.matcher = matcher
        self.phones = phones
        self.held = ""
        self.before = ""  # the last character released: a match at the start of `held` must not continue a word

    def push(self, text: str) -> list[Run]:
        self.held += unicodedata.normalize("NFC", text)
        return self._release(final=False)

    def flush(self) -> list[Run]:
        return self._release(final=True)

    def _release(self, final: bool) -> list[Run]:
        text = self.held
        if self.matcher is None or not self.matcher.rules:
            self.held = ""
            return [Run(text)] if text else []
        cut = len(text) if final else max(0, len(text) - self.matcher.longest)
        runs, pos, off = [], 0, len(self.before)
        for m in self.matcher.matches(self.before + text, off):
            start, end = m.start - off, m.end - off
            if end > cut:  # may still change with more text: held back from its start
                cut = min(cut, start)
                break
            runs += [Run(text[pos:start]), rule_run(m.rule, text[start:end], self.phones)]
            pos = end
        runs.append(Run(text[pos:cut]))
        self.before = (self.before + text[:cut])[-1:]
        self.held = text[cut:]
        return list(merged(runs))
