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
