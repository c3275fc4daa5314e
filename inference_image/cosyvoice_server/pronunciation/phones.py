"""Pronunciations as a model's phone markup, decided by its tokenizer alone.

A model takes a phone alphabet when its tokenizer holds that alphabet's tokens as added tokens (CosyVoice3's
has `[M]`, `[AY1]`, ... for CMU's ARPAbet and `[j]`, `[iā]`, ... for pinyin initials and toned finals); a
pronunciation becomes those tokens written in a row, which the tokenizer reads as one token each in place of
the word's spelling. IPA is taken where it maps exactly onto ARPAbet (a table of English phonemes; stress
marks to 1 and 2, other vowels 0); any other symbol is refused, never approximated.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

CMU_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
CMU_CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH", "T",
                  "TH", "V", "W", "Y", "Z", "ZH")
PINYIN_INITIALS = ("b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "zh", "ch", "sh", "r", "z",
                   "c", "s", "y", "w")

# IPA for General American English phonemes, each with exactly one ARPAbet phoneme. Length marks are the same
# phoneme in British-style transcriptions of these vowels; the tie bar is dropped before lookup.
IPA_VOWELS = {"ɑ": "AA", "ɑː": "AA", "æ": "AE", "ʌ": "AH", "ə": "AH", "ɔ": "AO", "ɔː": "AO", "aʊ": "AW", "aɪ": "AY",
              "ɛ": "EH", "ɝ": "ER", "ɚ": "ER", "eɪ": "EY", "ɪ": "IH", "i": "IY", "iː": "IY", "oʊ": "OW", "ɔɪ": "OY",
              "ʊ": "UH", "u": "UW", "uː": "UW"}
IPA_CONSONANTS = {"b": "B", "tʃ": "CH", "d": "D", "ð": "DH", "f": "F", "ɡ": "G", "g": "G", "h": "HH", "dʒ": "JH",
                  "k": "K", "l": "L", "m": "M", "n": "N", "ŋ": "NG", "p": "P", "ɹ": "R", "r": "R", "s": "S", "ʃ": "SH",
                  "t": "T", "θ": "TH", "v": "V", "w": "W", "j": "Y", "z": "Z", "ʒ": "ZH"}
_IPA = IPA_VOWELS | IPA_CONSONANTS
_IPA_LONGEST = sorted(_IPA, key=len, reverse=True)
PRIMARY, SECONDARY, TIE = "\u02c8", "\u02cc", "\u0361"

_TONED = {"ā": ("a", 1), "á": ("a", 2), "ǎ": ("a", 3), "à": ("a", 4), "ē": ("e", 1), "é": ("e", 2), "ě": ("e", 3),
          "è": ("e", 4), "ī": ("i", 1), "í": ("i", 2), "ǐ": ("i", 3), "ì": ("i", 4), "ō": ("o", 1), "ó": ("o", 2),
          "ǒ": ("o", 3), "ò": ("o", 4), "ū": ("u", 1), "ú": ("u", 2), "ǔ": ("u", 3), "ù": ("u", 4), "ǖ": ("ü", 1),
          "ǘ": ("ü", 2), "ǚ": ("ü", 3), "ǜ": ("ü", 4)}
_MARK = {(base, tone): marked for marked, (base, tone) in _TONED.items()}
_SYLLABLE = re.compile(r"^([a-zü]+)([0-5]?)$")

ALPHABETS = ("ipa", "x-cmu", "x-pinyin")


class PronunciationError(ValueError):
    """A pronunciation the model cannot say; the message names what is wrong."""


@dataclass(frozen=True)
class PhoneSet:
    """The phone tokens a model's tokenizer holds (its added tokens' contents)."""

    tokens: frozenset[str]

    @classmethod
    def of(cls, tokenizer) -> PhoneSet:
        return cls(frozenset(t.content for t in tokenizer.get_added_tokens_decoder().values()))

    @property
    def cmu(self) -> bool:
        """Every ARPAbet phoneme has a token (a vowel with or without its stress digit)."""
        return all(f"[{c}]" in self.tokens for c in CMU_CONSONANTS) and all(
            any(f"[{v}{s}]" in self.tokens for s in ("", "0", "1", "2")) for v in CMU_VOWELS)

    @property
    def pinyin(self) -> bool:
        """Every pinyin initial has a token (its toned finals are checked one by one)."""
        return all(f"[{i}]" in self.tokens for i in PINYIN_INITIALS)

    @property
    def alphabets(self) -> list[str]:
        """The PLS/SSML alphabets this model takes."""
        return [a for a, ok in (("ipa", self.cmu), ("x-cmu", self.cmu), ("x-pinyin", self.pinyin)) if ok]

    def markup(self, alphabet: str, ph: str) -> str:
        """`ph` in `alphabet` as the model's phone tokens; PronunciationError when it cannot be said."""
        alphabet = alphabet.lower()
        if alphabet not in ALPHABETS:
            raise PronunciationError(f"the alphabet '{alphabet}' is not one this server reads (ipa, x-cmu, x-pinyin)")
        if alphabet not in self.alphabets:
            took = f"its tokenizer's phone alphabets are {', '.join(self.alphabets)}" if self.alphabets else \
                "its tokenizer has no phone tokens"
            raise PronunciationError(f"this model cannot take '{alphabet}' pronunciations ({took})")
        phones = {"ipa": ipa_to_cmu, "x-cmu": cmu_phones, "x-pinyin": pinyin_phones}[alphabet](ph)
        if not phones:
            raise PronunciationError("the pronunciation is empty")
        # a tokenizer may write ü as v (CosyVoice3 has [ǜ] but [vè])
        tokens = [t if t in self.tokens or "ü" not in t else t.replace("ü", "v") for t in (f"[{p}]" for p in phones)]
        missing = [t for t in tokens if t not in self.tokens]
        if missing:
            raise PronunciationError(f"the model's tokenizer has no phone token {missing[0]}")
        return "".join(tokens)


def cmu_phones(ph: str) -> list[str]:
    """`M AY1 N UW1 T` -> its phones, upper case; a symbol that is no ARPAbet phoneme is refused."""
    out = []
    for sym in ph.split():
        s = sym.upper()
        base, stress = (s[:-1], s[-1]) if s[-1:] in "012" else (s, "")
        if not ((base in CMU_VOWELS) or (base in CMU_CONSONANTS and not stress)):
            raise PronunciationError(f"'{sym}' is not a CMU (ARPAbet) phone")
        out.append(s)
    return out


def ipa_to_cmu(ph: str) -> list[str]:
    """English IPA -> ARPAbet phones: each vowel gets 1 after ˈ, 2 after ˌ, else 0. Symbols without an exact
    ARPAbet phoneme (ɒ, ɾ, ʔ, a syllabic mark...) are refused by name."""
    text = unicodedata.normalize("NFC", ph).replace(TIE, "")
    out, stress, i = [], None, 0
    while i < len(text):
        c = text[i]
        if c.isspace() or c == ".":
            i += 1
            continue
        if c in (PRIMARY, SECONDARY):
            if stress is not None:
                raise PronunciationError(f"two stress marks in a row in '{ph}'")
            stress, i = ("1" if c == PRIMARY else "2"), i + 1
            continue
        sym = next((s for s in _IPA_LONGEST if text.startswith(s, i)), None)
        if sym is None:
            raise PronunciationError(f"the IPA symbol '{c}' (U+{ord(c):04X}) has no exact CMU phone")
        if sym in IPA_VOWELS:
            out.append(IPA_VOWELS[sym] + (stress or "0"))
            stress = None
        else:
            out.append(IPA_CONSONANTS[sym])
        i += len(sym)
    if stress is not None:
        raise PronunciationError(f"a stress mark without a vowel after it in '{ph}'")
    return out


def _tone_of(syllable: str) -> tuple[str, int]:
    """`jiā` / `jia1` / `lv4` -> (`jia`, 1) / (`lü`, 4); tone 5 (or 0, or none written) is the neutral tone."""
    s = unicodedata.normalize("NFC", syllable.lower()).replace("v", "ü").replace("u:", "ü")
    marks = [(i, _TONED[c]) for i, c in enumerate(s) if c in _TONED]
    if len(marks) > 1:
        raise PronunciationError(f"the pinyin syllable '{syllable}' has {len(marks)} tone marks")
    if marks:
        i, (base, tone) = marks[0]
        s = s[:i] + base + s[i + 1:]
        if s[-1:].isdigit():
            raise PronunciationError(f"the pinyin syllable '{syllable}' has a tone mark and a tone number")
    m = _SYLLABLE.match(s)
    if m is None:
        raise PronunciationError(f"'{syllable}' is not a pinyin syllable (letters with a tone mark or a tone "
                                 "number 1-5)")
    if marks:
        return m.group(1), marks[0][1][1]
    return m.group(1), int(m.group(2) or 5) % 5 or 5


def _marked(final: str, tone: int) -> str:
    """The final with its tone mark where pinyin writes it: on a or e, on the o of ou, else on the last vowel."""
    if tone == 5:
        return final
    vowels = [i for i, c in enumerate(final) if c in "aeiouü"]
    if not vowels:
        raise PronunciationError(f"the pinyin final '{final}' has no vowel to carry the tone")
    at = final.find("a") if "a" in final else final.find("e") if "e" in final else \
        final.find("o") if "ou" in final else vowels[-1]
    return final[:at] + _MARK[(final[at], tone)] + final[at + 1:]


def pinyin_phones(ph: str) -> list[str]:
    """`jiā hé` or `jia1 he2` -> `j`, `iā`, `h`, `é`: each syllable's initial and its toned final. ü is written
    u after j, q, x and y, as pinyin writes it."""
    out = []
    for syllable in ph.split():
        base, tone = _tone_of(syllable)
        initial = next((i for i in sorted(PINYIN_INITIALS, key=len, reverse=True)
                        if base.startswith(i) and len(base) > len(i)), "")
        final = base[len(initial):]
        if initial in ("j", "q", "x", "y"):
            final = final.replace("ü", "u")
        out += ([initial] if initial else []) + [_marked(final, tone)]
    return out


# Pinyin finals as written (ü after l and n, u after j, q, x and y), without tones.
PINYIN_FINALS = frozenset("a o e ai ei ao ou an en ang eng ong er i ia ie iao iu ian in iang ing iong u ua uo uai ui "
                          "uan un uang ueng ü üe üan ün ue ve v".split())


def is_phone(token: str) -> bool:
    """A tokenizer's added token that is a phone of one of the alphabets (`[AY1]`, `[j]`, `[iā]`), not a tag."""
    if not (token.startswith("[") and token.endswith("]")):
        return False
    inner = token[1:-1]
    base = inner[:-1] if inner[-1:] in "012" else inner
    if (base in CMU_VOWELS) or (inner in CMU_CONSONANTS) or inner in PINYIN_INITIALS:
        return True
    plain = "".join(_TONED[c][0] if c in _TONED else c for c in unicodedata.normalize("NFC", inner))
    return plain in PINYIN_FINALS
