"""Text frontend as upstream CosyVoice2's `CosyVoiceFrontEnd.text_normalize` (cli/frontend.py, with
wetext): normalization, the paragraph split into LLM segments, and the Qwen2 tokenizer.

With `text_frontend` on: text with Chinese characters goes through wetext's zh normalizer and
upstream's clean-ups (blanks between CJK characters, corner marks, brackets, '.' -> '。'), other text
through wetext's en normalizer and digits spelled out; then `split_paragraph` cuts at sentence
punctuation and packs sentences into segments of about 60-80 tokens (characters for Chinese), merging
a short tail (< 20) into the previous segment; segments of punctuation only are dropped. With it off,
the text is one segment, untouched (upstream's `text_frontend=False`).

Before either, control characters are removed, format characters (zero-width spaces and joiners,
soft hyphens, bidi marks: Unicode's Cf, which the tokenizer would turn into sounds) dropped and
whitespace collapsed, and a segment longer than `hard_max_tokens` (a sentence without punctuation)
is cut there: upstream would pass it whole and run past its flow noise buffer.
"""

from __future__ import annotations

import re
import sys
import threading
import unicodedata
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .pronunciation.phones import PhoneSet, is_phone
from .pronunciation.plan import Pause, Plan, Run

_SPACE = re.compile(r"\s+")
_CONTROL = re.compile(r"[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]")
_CHINESE = re.compile(r"[\u4e00-\u9fff]")
_ZH_STOPS = "。？！；：、.?!;"
_EN_STOPS = ".?!;:"
END_OF_PROMPT = "<|endofprompt|>"  # ends an instruction in the LLM prompt (upstream's special token)


def clean(text: str) -> str:
    """Control characters to spaces, format characters (Cf) out; character by character, so any split of a
    text cleans to the pieces of the whole text's cleaning."""
    if not text.isascii():
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return _CONTROL.sub(" ", text)


def normalize(text: str) -> str:
    """Cleaned, whitespace runs to one space (no NFKC: upstream keeps full-width punctuation)."""
    return _SPACE.sub(" ", clean(text)).strip()


def speakable(text: str) -> bool:
    """Has a letter or a digit: punctuation, symbols (emoji), spaces and marks alone say nothing."""
    return any(unicodedata.category(c)[0] in "LN" for c in text)


def contains_chinese(text: str) -> bool:
    return bool(_CHINESE.search(text))


def only_punctuation(text: str) -> bool:
    return all(unicodedata.category(c)[0] in "PS" for c in text)


def drop_blanks_between_cjk(text: str) -> str:
    """Keeps a space only between two ASCII non-space characters (upstream's replace_blank)."""
    out = []
    for i, c in enumerate(text):
        if c == " ":
            nxt, prev = text[i + 1] if i + 1 < len(text) else "", text[i - 1] if i else ""
            if nxt.isascii() and nxt not in ("", " ") and prev.isascii() and prev not in ("", " "):
                out.append(c)
        else:
            out.append(c)
    return "".join(out)


def zh_cleanup(text: str, end: bool = True) -> str:
    """`end`: the text ends the input (a trailing comma becomes a full stop), not a piece before phone markup."""
    text = drop_blanks_between_cjk(text.replace("\n", ""))
    text = text.replace("²", "平方").replace("³", "立方")
    text = text.replace(".", "。").replace(" - ", "，")
    for mark in ("（", "）", "【", "】", "`"):
        text = text.replace(mark, "")
    text = text.replace("——", " ")
    return re.sub(r"[，,、]+$", "。", text) if end else text


def spell_out_numbers(text: str, to_words) -> str:
    return re.sub(r"\d+", lambda m: to_words(m.group(0)), text)


def split_paragraph(text: str, length, zh: bool, max_n: int = 80, min_n: int = 60, merge_n: int = 20) -> list[str]:
    """Upstream's split_paragraph: sentences end at punctuation (a closing quote stays with its sentence);
    a segment is closed when adding the next sentence passes max_n while it already has more than min_n;
    a last segment shorter than merge_n joins the one before. `length` counts tokens (characters for zh)."""
    stops = _ZH_STOPS if zh else _EN_STOPS
    if text[-1] not in stops:
        text += "。" if zh else "."
    sentences, start, i = [], 0, 0
    while i < len(text):
        if text[i] in stops:
            end = i + 1
            if end < len(text) and text[end] in ('"', "”"):
                end += 1
            if text[start:i]:
                sentences.append(text[start:end])
            elif end > i + 1 and sentences:  # a lone stop before a quote: the quote joins the previous sentence
                sentences[-1] += text[i + 1:end]
            start, i = end, end
        else:
            i += 1
    segments, current = [], ""
    for s in sentences:
        if length(current + s) > max_n and length(current) > min_n:
            segments.append(current)
            current = ""
        current += s
    if current:
        if length(current) < merge_n and segments:
            segments[-1] += current
        else:
            segments.append(current)
    return segments


@dataclass(frozen=True)
class Spoken:
    """One LLM segment of a plan: its text ids, what it says (normalized, as reported in segment timing), its
    speed; `continued`: the rest of the segment before, cut at `hard_max_tokens`."""

    ids: np.ndarray
    text: str
    speed: float = 1.0
    continued: bool = False


_INFLECT_IMPORT = threading.Lock()  # the swap below is process-wide: one thread at a time


def _inflect_engine():
    """inflect's engine, imported without typeguard's instrumentation. `@typechecked` recompiles the engine's
    source when inflect is imported: 2.4 s of CPU in every process that normalizes English, a text worker's
    whole start-up, for argument checks that are off under `python -O` anyway (our calls pass strings)."""
    with _INFLECT_IMPORT:
        if "inflect" not in sys.modules:
            import typeguard

            instrumenting = typeguard.typechecked
            typeguard.typechecked = lambda target=None, **_: target if target is not None else (lambda t: t)
            try:
                import inflect  # noqa: F401
            finally:
                typeguard.typechecked = instrumenting
    import inflect

    return inflect.engine()


class TextFrontend:
    def __init__(self, tokenizer_path: Path, max_tokens_per_segment: int, min_tokens_per_segment: int = 60,
                 merge_tokens: int = 20, text_frontend: bool = True, hard_max_tokens: int = 400,
                 system_prompt: str | None = None) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.system_prompt = system_prompt
        self.max_tokens = max_tokens_per_segment
        self.min_tokens = min_tokens_per_segment
        self.merge_tokens = merge_tokens
        self.text_frontend = text_frontend
        self.hard_max = max(hard_max_tokens, max_tokens_per_segment)
        self._lock = threading.Lock()

    @classmethod
    def of_model(cls, model_dir: Path, spec) -> TextFrontend:
        """The frontend a model directory's manifest (`spec`: its `frontend` section) describes."""
        return cls(model_dir / spec.tokenizer, spec.max_text_tokens_per_segment, spec.min_text_tokens_per_segment,
                   spec.merge_text_tokens, spec.text_frontend, system_prompt=spec.system_prompt)

    @cached_property
    def _normalizers(self):
        from wetext import Normalizer

        return (Normalizer(lang="zh", operator="tn", remove_erhua=False), Normalizer(lang="en", operator="tn"),
                _inflect_engine().number_to_words)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def normalized(self, text: str) -> str:
        """The text normalized as one piece, before the split: upstream's `text_normalize(split=False)`."""
        text = normalize(text)
        if not text or not self.text_frontend or ("<|" in text and "|>" in text):  # upstream skips prompt markup
            return text
        return self._tn(text, contains_chinese(text))

    def _tn(self, text: str, zh: bool, end: bool = True) -> str:
        """wetext's zh or en normalization of cleaned text (`end`: see zh_cleanup)."""
        with self._lock:  # the request path and voice registration threads share the normalizers
            zh_tn, en_tn, to_words = self._normalizers
            try:
                if zh:
                    return zh_cleanup(zh_tn.normalize(text), end)
                return spell_out_numbers(en_tn.normalize(text), to_words)
            except AssertionError:  # wetext asserts on input its tagger reduces to nothing (control characters)
                return text

    def texts(self, text: str) -> list[str]:
        """The text of each LLM segment."""
        text = self.normalized(text)
        if not text:
            return []
        return self._split(text, contains_chinese(text))

    def _split(self, text: str, zh: bool, expand=lambda t: t) -> list[str]:
        """Upstream's split of normalized text into segments (`expand`: placeholders to what they stand for)."""
        if not self.text_frontend:
            return [text]
        length = (lambda t: len(expand(t))) if zh else (lambda t: len(self.encode(expand(t))))
        texts = split_paragraph(text, length, zh, self.max_tokens, self.min_tokens, self.merge_tokens)
        return [t for t in texts if not only_punctuation(expand(t))]

    def _part_texts(self, runs: tuple[Run, ...]) -> list[tuple[str, str]]:
        """A part's segments as (text the model reads, text reported): plain text exactly as any input;
        around verbatim runs (phone markup) the plain runs are normalized one by one, in the part's language,
        and the markup goes in untouched. Each verbatim run stands in the split as one private-use character,
        so no sentence end or normalization can fall inside it."""
        if not any(r.verbatim for r in runs):
            return [(t, t) for t in self.texts("".join(r.text for r in runs))]
        zh = contains_chinese("".join(r.text for r in runs if not r.verbatim))
        last = max(i for i, r in enumerate(runs) if not r.verbatim) if any(not r.verbatim for r in runs) else -1
        pieces, model, shown = [], {}, {}
        for i, r in enumerate(runs):
            if r.verbatim:
                key = 0xF0000 + len(model)
                model[key], shown[key] = r.text, r.shown or r.text
                pieces.append(chr(key))
                continue
            text = normalize(r.text)
            if text and self.text_frontend:
                text = self._tn(text, zh, end=i == last)
            if text:
                pieces.append((" " if r.text[:1].isspace() else "") + text + (" " if r.text[-1:].isspace() else ""))
            elif r.text[:1].isspace():
                pieces.append(" ")
        text = _SPACE.sub(" ", "".join(pieces)).strip()
        if not text:
            return []
        expand = lambda t: t.translate(model)  # noqa: E731
        return [(expand(t), t.translate(shown).strip()) for t in self._split(text, zh, expand)]

    def plan_segments(self, plan: Plan) -> list[Spoken | Pause]:
        """A plan's LLM segments, with what each says, and its pauses in place."""
        out: list[Spoken | Pause] = []
        for item in plan:
            if isinstance(item, Pause):
                out.append(item)
                continue
            for text, shown in self._part_texts(item.runs):
                ids = self.encode(text)
                for k in range(0, len(ids), self.hard_max):  # see segments()
                    out.append(Spoken(np.asarray(ids[k:k + self.hard_max], np.int64), "" if k else shown,
                                      item.speed, k > 0))
        return out

    def prompt_tokens(self, transcript: str) -> list[int]:
        """A zero-shot prompt's transcript as the LLM's prompt text (upstream's inference_zero_shot); after the
        model's system prompt where it has one (that text then carries <|endofprompt|>, so upstream leaves the
        transcript unnormalized)."""
        if self.system_prompt is None:
            return self.encode(self.normalized(transcript))
        transcript = normalize(transcript)
        if END_OF_PROMPT not in transcript:
            transcript = self.system_prompt + END_OF_PROMPT + transcript
        return self.encode(transcript)

    @property
    def takes_instructions(self) -> bool:
        return self.tokenizer.token_to_id(END_OF_PROMPT) is not None

    @property
    def markup_tags(self) -> list[str]:
        """The tokenizer's special tokens a text may contain to be voiced (`[breath]`, `<strong>`...): its added
        tokens less the chat and prompt structure (`<|...|>`) and phones (`phones`), in vocabulary order."""
        added = sorted(self.tokenizer.get_added_tokens_decoder().items())
        return [t.content for _, t in added
                if not (t.content.startswith("<|") and t.content.endswith("|>")) and not is_phone(t.content)]

    @cached_property
    def phones(self) -> PhoneSet:
        """The phone alphabets and tokens this model's tokenizer holds (pronunciation/phones.py)."""
        return PhoneSet.of(self.tokenizer)

    def instruction_tokens(self, instruction: str) -> list[int]:
        """Upstream's instruct2 prompt text: the instruction as written (not normalized, as upstream) ending
        in the end-of-prompt token, after the model's system prompt where it has one (CosyVoice3's
        `You are a helpful assistant. <instruction><|endofprompt|>`); an instruction that already starts with it
        is taken as written."""
        text = normalize(instruction)
        if self.system_prompt is not None and not text.startswith(self.system_prompt):
            text = f"{self.system_prompt} {text}"
        return self.encode(text if text.endswith(END_OF_PROMPT) else text + END_OF_PROMPT)

    def segments(self, text: str) -> list[np.ndarray]:
        out = []
        for t in self.texts(text):
            ids = self.encode(t)
            out.extend(ids[i : i + self.hard_max] for i in range(0, len(ids), self.hard_max))
        return [np.asarray(s, dtype=np.int64) for s in out if s]
