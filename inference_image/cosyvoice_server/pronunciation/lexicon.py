"""W3C Pronunciation Lexicon Specification (PLS 1.0) documents, and where their graphemes are in a text.

A lexicon is `<lexicon alphabet="..." xml:lang="...">` with `<lexeme>`s, each one or more `<grapheme>`s and
pronunciations: `<alias>` (other text to say) or `<phoneme>` (in the lexicon's alphabet or its own
`alphabet`). Of several pronunciations the one with `prefer="true"` is used, else the first (PLS 4.6).

Matching: a grapheme matches as written, case and all (NFC, and any run of whitespace in it matching any
run in the text), only as a whole word: never inside a longer word of a script written with spaces
(Latin, Cyrillic, ...); Chinese and Japanese characters are matched where they stand, as those scripts do
not separate words. At each position the longest grapheme wins; earlier lexicons win over later ones for
the same grapheme, and a lexicon's earlier lexeme over its later ones.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property

from .xml import XmlError, local, parse

PLS_NS = "http://www.w3.org/2005/01/pronunciation-lexicon"
MAX_LEXICON_CHARS = 1 << 20  # a ConfigMap holds at most 1 MiB
MAX_DEPTH = 8
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")

# a letter or digit of a script that separates words with spaces: Han, kana and CJK symbols are left out
_WORD = r"[^\W\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
_WORD_CHAR = re.compile(_WORD)


class LexiconError(ValueError):
    """A lexicon this server cannot use; the message names the lexicon and, where it can, the line."""


@dataclass(frozen=True)
class Rule:
    """One lexeme's pronunciation: `alias` text, or a `phoneme` string in `alphabet`."""

    lexeme: str  # its first grapheme, naming it in messages
    kind: str  # "alias" or "phoneme"
    value: str
    alphabet: str | None = None


@dataclass(frozen=True)
class Lexicon:
    name: str
    entries: dict[str, Rule]  # grapheme (normalized) -> rule, in document order
    lang: str | None = None
    alphabet: str | None = None


def grapheme_key(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).split())


class _PlsTarget:
    """Collects lexemes while the parser reads the document (pure Python callbacks: small documents)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stack: list[str] = []
        self.text: list[str] = []
        self.lexemes: list[tuple[int, list[str], list[tuple[str, str, str | None, bool]]]] = []
        self.root: dict[str, str] | None = None
        self.attrib: dict[str, str] = {}

    def _fail(self, message: str, line: int):
        raise XmlError(f"{message} (line {line})")

    def start(self, tag: str, attrib: dict[str, str], line: int) -> None:
        ns, name = local(tag)
        if ns not in (PLS_NS, None):
            self._fail(f"element <{name}> is not in the PLS namespace", line)
        parent = self.stack[-1] if self.stack else None
        allowed = {None: ("lexicon",), "lexicon": ("lexeme", "meta", "metadata"),
                   "lexeme": ("grapheme", "phoneme", "alias", "example")}.get(parent, ())
        if parent in ("meta", "metadata", "example") or name not in allowed:
            if parent in ("meta", "metadata"):  # metadata may hold anything
                self.stack.append(parent)
                return
            self._fail(f"<{name}> cannot be inside <{parent or 'the document'}>", line)
        if name == "lexicon":
            self.root = attrib
        elif name == "lexeme":
            self.lexemes.append((line, [], []))
        self.stack.append(name)
        self.attrib = attrib
        self.text = []

    def data(self, text: str) -> None:
        self.text.append(text)

    def end(self, tag: str, line: int) -> None:
        name = self.stack.pop()
        if name not in ("grapheme", "phoneme", "alias") or self.stack[-1:] != ["lexeme"]:
            return
        text = "".join(self.text).strip()
        if not text:
            self._fail(f"<{name}> is empty", line)
        _, graphemes, prons = self.lexemes[-1]
        if name == "grapheme":
            graphemes.append(text)
        else:
            alphabet = self.attrib.get("alphabet") if name == "phoneme" else None
            prons.append((name, text, alphabet, self.attrib.get("prefer", "false") == "true"))


def parse_pls(name: str, text: str) -> Lexicon:
    """A PLS document as a Lexicon; LexiconError says what is wrong with it."""
    target = _PlsTarget(name)
    try:
        parse(text, target, MAX_LEXICON_CHARS, MAX_DEPTH, f"lexicon '{name}'")
    except XmlError as exc:
        raise LexiconError(f"lexicon '{name}': {exc}") from None
    if target.root is None:
        raise LexiconError(f"lexicon '{name}': the document is not a PLS <lexicon>")
    default_alphabet = target.root.get("alphabet")
    entries: dict[str, Rule] = {}
    for line, graphemes, prons in target.lexemes:
        if not graphemes:
            raise LexiconError(f"lexicon '{name}': the lexeme at line {line} has no <grapheme>")
        if not prons:
            raise LexiconError(f"lexicon '{name}': the lexeme '{graphemes[0]}' (line {line}) has no <phoneme> or "
                               "<alias>")
        kind, value, alphabet, _ = next((p for p in prons if p[3]), prons[0])
        if kind == "phoneme" and not (alphabet or default_alphabet):
            raise LexiconError(f"lexicon '{name}': the lexeme '{graphemes[0]}' (line {line}) has a <phoneme> "
                               "without an alphabet (set it on <lexicon> or <phoneme>)")
        rule = Rule(graphemes[0], kind, value, (alphabet or default_alphabet) if kind == "phoneme" else None)
        for g in graphemes:
            entries.setdefault(grapheme_key(g), rule)
    return Lexicon(name, entries, target.root.get("{http://www.w3.org/XML/1998/namespace}lang"), default_alphabet)


@dataclass(frozen=True)
class Match:
    start: int
    end: int
    rule: Rule


@dataclass
class Matcher:
    """The graphemes of some lexicons, in the order given (earlier lexicons win)."""

    lexicons: tuple[Lexicon, ...]
    rules: dict[str, Rule] = field(init=False)

    def __post_init__(self) -> None:
        self.rules = {}
        for lex in self.lexicons:
            for g, rule in lex.entries.items():
                self.rules.setdefault(g, rule)

    @cached_property
    def longest(self) -> int:
        return max((len(g) for g in self.rules), default=0)

    @cached_property
    def _pattern(self) -> re.Pattern | None:
        if not self.rules:
            return None
        alts = []
        for g in sorted(self.rules, key=len, reverse=True):  # Python's alternation takes the first that matches
            body = r"\s+".join(re.escape(w) for w in g.split(" "))
            left = f"(?<!{_WORD})" if _WORD_CHAR.match(g[0]) else ""
            right = f"(?!{_WORD})" if _WORD_CHAR.match(g[-1]) else ""
            alts.append(left + body + right)
        return re.compile("|".join(alts))

    def matches(self, text: str, start: int = 0, end: int | None = None) -> list[Match]:
        """Non-overlapping matches, leftmost first, longest at each position (text is NFC)."""
        if self._pattern is None:
            return []
        end = len(text) if end is None else end
        return [Match(m.start(), m.end(), self.rules[grapheme_key(m.group())])
                for m in self._pattern.finditer(text, start, end)]
