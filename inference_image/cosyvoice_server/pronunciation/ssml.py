"""The SSML subset this server speaks, read into actions as the document arrives.

    <speak>            the root (version, xml:lang)
    <p>, <s>           paragraph and sentence: each starts and ends a segment
    <break time|strength/>   silence of that length, in place (a segment of its own)
    <sub alias>        says the alias instead of the text
    <phoneme alphabet ph>    says the pronunciation (ipa, x-cmu, x-pinyin) with the model's phone tokens
    <say-as interpret-as>    characters / spell-out, digits, cardinal, date (format), telephone
    <prosody rate>     speed of the part (x-slow .. x-fast, a percentage, or a relative +n% / -n%)
    <lang xml:lang>    the model's language token where its tokenizer has one (<|en|>), else the text as is

Anything else is refused naming the element and its line. The interpreter emits actions (`Say`, `Mark`,
`Boundary`, `Silence`, `Rate`) as elements close, so a WebSocket session can act on them while the document
is still arriving; `build` collects them into a plan for a whole document.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .lexicon import Matcher
from .phones import PhoneSet, PronunciationError
from .plan import Part, Pause, Plan, Run, apply_lexicons, merged
from .xml import Parser, XmlError, local

SSML_NS = "http://www.w3.org/2001/10/synthesis"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
MAX_SSML_CHARS = 32768  # one request's document
MAX_STREAMED_SSML_CHARS = 1 << 26  # a WebSocket session's, over all its messages (each bounded by the body limit)
MAX_DEPTH = 16
MAX_BREAK_S = 10.0
# SSML leaves the strengths' lengths to the processor; these are the common cloud services' (Azure's) values.
BREAK_STRENGTH = {"none": 0.0, "x-weak": 0.25, "weak": 0.5, "medium": 0.75, "strong": 1.0, "x-strong": 1.25}
RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.5}
SAY_AS = ("characters", "spell-out", "digits", "cardinal", "number", "date", "telephone")
ELEMENTS = ("speak", "p", "s", "break", "sub", "phoneme", "say-as", "prosody", "lang")
# the attributes each element takes (xml:lang anywhere it makes sense); others are refused
ATTRIBUTES = {"speak": {"version", XML_LANG, "{http://www.w3.org/2001/XMLSchema-instance}schemaLocation"},
              "p": {XML_LANG}, "s": {XML_LANG}, "break": {"time", "strength"}, "sub": {"alias"},
              "phoneme": {"alphabet", "ph"}, "say-as": {"interpret-as", "format", "detail"}, "prosody": {"rate"},
              "lang": {XML_LANG}}
LEAVES = ("sub", "phoneme", "say-as")  # text only inside
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
_CHINESE = re.compile(r"[\u4e00-\u9fff]")


class SsmlError(XmlError):
    """The document is not SSML this server speaks; the message names the element and line."""


@dataclass(frozen=True)
class Say:
    text: str
    lexicons: bool = True  # the document's own words: lexicons apply (not to an alias or a say-as reading)


@dataclass(frozen=True)
class Mark:
    markup: str  # the model's phone or language tokens, verbatim
    shown: str = ""


@dataclass(frozen=True)
class Boundary:
    pass


@dataclass(frozen=True)
class Silence:
    seconds: float


@dataclass(frozen=True)
class Rate:
    speed: float  # for what follows, until the next Rate


Action = Say | Mark | Boundary | Silence | Rate


def _seconds(value: str) -> float | None:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*", value)
    if m is None:
        return None
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


def rate(value: str) -> float | None:
    """SSML's prosody rate as a speed factor: a keyword, a percentage of normal, or a relative change."""
    v = value.strip().lower()
    if v in RATES:
        return RATES[v]
    m = re.fullmatch(r"([+-]?)(\d+(?:\.\d+)?)%", v)
    if m is None:
        m2 = re.fullmatch(r"(\d+(?:\.\d+)?)", v)  # a bare number: a multiple of the normal rate
        return float(m2.group(1)) if m2 else None
    n = float(m.group(2)) / 100
    return n if not m.group(1) else 1 + n if m.group(1) == "+" else 1 - n


def _digits(text: str) -> str:
    return " ".join(c for c in text if not c.isspace())


def say_as(kind: str, text: str, fmt: str | None, zh: bool) -> str:
    """A say-as element's text as words the normalizer reads the intended way; ValueError says why not."""
    text = " ".join(text.split())
    if kind in ("characters", "spell-out"):
        return _digits(text)
    if kind == "digits":
        if not re.fullmatch(r"[\d\s]+", text):
            raise ValueError(f"say-as digits needs digits, got '{text}'")
        return _digits(text)
    if kind in ("cardinal", "number"):
        number = re.sub(r"(?<=\d)[,\s](?=\d{3})", "", text)
        if not re.fullmatch(r"[+-]?\d+(\.\d+)?", number):
            raise ValueError(f"say-as cardinal needs a number, got '{text}'")
        return number.replace("-", "minus " if not zh else "负", 1) if number.startswith("-") else number.lstrip("+")
    if kind == "telephone":
        groups = [g for g in re.split(r"[\s().-]+", text) if g]
        if not groups or not all(re.fullmatch(r"\+?\d+", g) for g in groups):
            raise ValueError(f"say-as telephone needs digits in groups, got '{text}'")
        plus = "加" if zh else "plus "
        return (", " if not zh else "，").join((plus if g[0] == "+" else "") + _digits(g.lstrip("+")) for g in groups)
    if kind == "date":
        return _date(text, (fmt or "").lower(), zh)
    raise ValueError(f"interpret-as '{kind}' is not supported (take one of {', '.join(SAY_AS)})")


def _date(text: str, fmt: str, zh: bool) -> str:
    fields = [f for f in re.split(r"[\s/.-]+", text) if f]
    if not fmt:
        fmt = "ymd" if fields and len(fields[0]) == 4 else "mdy"
    if not re.fullmatch(r"[ymd]{1,3}", fmt) or len(set(fmt)) != len(fmt) or len(fields) != len(fmt) \
            or not all(f.isdigit() for f in fields):
        raise ValueError(f"say-as date with format '{fmt}' needs {len(fmt)} numbers, got '{text}'")
    d = dict(zip(fmt, map(int, fields)))
    if not 1 <= d.get("m", 1) <= 12 or not 1 <= d.get("d", 1) <= 31:
        raise ValueError(f"'{text}' is not a date in the format '{fmt}'")
    if zh:
        return "".join(f"{d[k]}{u}" for k, u in (("y", "年"), ("m", "月"), ("d", "日")) if k in d)
    month = MONTHS[d["m"] - 1] if "m" in d else ""
    day = str(d["d"]) if "d" in d else ""
    head = " ".join(x for x in (month, day) if x)
    return ", ".join(x for x in (head, str(d["y"]) if "y" in d else "") if x)


class Interpreter:
    """The target of an XML parser: checks each element and emits actions to `emit`. `phones`: what the
    model says (phone tokens, language tokens); `speed_ok`: prosody rate can be honoured here (else refused)."""

    def __init__(self, emit: Callable[[Action], None], phones: PhoneSet, speed_ok: bool = True,
                 speed_refusal: str = "") -> None:
        self.emit = emit
        self.phones = phones
        self.speed_ok = speed_ok
        self.speed_refusal = speed_refusal
        self.stack: list[tuple[str, dict[str, str], int]] = []
        self.langs: list[str | None] = []
        self.rates: list[float] = [1.0]
        self.leaf_text: list[str] = []
        self.seen_root = False
        self.closed = False

    def _fail(self, message: str, line: int):
        raise SsmlError(f"{message} (line {line})")

    def _lang(self) -> str | None:
        return next((lang for lang in reversed(self.langs) if lang), None)

    def start(self, tag: str, attrib: dict[str, str], line: int) -> None:
        ns, name = local(tag)
        if ns not in (SSML_NS, None) or name not in ELEMENTS:
            self._fail(f"<{name}> is not supported; this server takes {', '.join(f'<{e}>' for e in ELEMENTS)}", line)
        if not self.stack and name != "speak":
            self._fail(f"the document must be a <speak> element, not <{name}>", line)
        if self.stack and name == "speak":
            self._fail("<speak> cannot be inside another element", line)
        if self.stack and self.stack[-1][0] in LEAVES:
            self._fail(f"<{name}> cannot be inside <{self.stack[-1][0]}>, which takes text only", line)
        extra = sorted(set(attrib) - ATTRIBUTES[name])
        if extra:
            self._fail(f"<{name}> does not take the attribute '{local(extra[0])[1]}'", line)
        self.seen_root = True
        self.stack.append((name, attrib, line))
        self.langs.append(attrib.get(XML_LANG))
        self.leaf_text = []
        if name in ("p", "s"):
            self.emit(Boundary())
        elif name == "break":
            self._break(attrib, line)
        elif name == "prosody":
            self._prosody(attrib, line)
        elif name == "lang":
            lang = attrib.get(XML_LANG)
            if not lang:
                self._fail("<lang> needs xml:lang", line)
            token = f"<|{lang.split('-')[0].lower()}|>"
            if token in self.phones.tokens:  # the model's own language markup, where its tokenizer has it
                self.emit(Mark(token))

    def _break(self, attrib: dict[str, str], line: int) -> None:
        if "time" in attrib:
            seconds = _seconds(attrib["time"])
            if seconds is None:
                self._fail(f"<break time=\"{attrib['time']}\">: give a time like 700ms or 1.5s", line)
        else:
            strength = attrib.get("strength", "medium")
            if strength not in BREAK_STRENGTH:
                self._fail(f"<break strength=\"{strength}\">: take one of {', '.join(BREAK_STRENGTH)}", line)
            seconds = BREAK_STRENGTH[strength]
        if seconds > MAX_BREAK_S:
            self._fail(f"<break> of {seconds:g} s is longer than the {MAX_BREAK_S:g} s a break may be", line)
        self.emit(Boundary())
        if seconds > 0:
            self.emit(Silence(seconds))

    def _prosody(self, attrib: dict[str, str], line: int) -> None:
        if "rate" not in attrib:
            self._fail("<prosody> needs rate (the only prosody this server changes)", line)
        factor = rate(attrib["rate"])
        if factor is None or factor <= 0:
            self._fail(f"<prosody rate=\"{attrib['rate']}\">: give x-slow, slow, medium, fast, x-fast, a "
                       "percentage (150%) or a change (+20%)", line)
        speed = self.rates[-1] * factor
        if speed != 1.0 and not self.speed_ok:
            self._fail(f"<prosody rate> {self.speed_refusal}", line)
        if not 0.25 <= speed <= 4.0:
            self._fail(f"<prosody rate=\"{attrib['rate']}\"> makes a speed of {speed:g}; it must stay within "
                       "0.25-4", line)
        self.rates.append(speed)
        self.emit(Boundary())
        self.emit(Rate(speed))

    def data(self, text: str) -> None:
        if not self.stack:
            if text.strip():
                raise SsmlError("text outside <speak>")
            return
        if self.stack[-1][0] in LEAVES:
            self.leaf_text.append(text)
        elif self.stack[-1][0] == "break":
            if text.strip():
                raise SsmlError(f"<break> must be empty (line {self.stack[-1][2]})")
        else:
            self.emit(Say(text))

    def end(self, tag: str, line: int) -> None:
        name, attrib, start = self.stack.pop()
        lang = self._lang()
        self.langs.pop()
        text = "".join(self.leaf_text)
        if name == "sub":
            if "alias" not in attrib:
                self._fail("<sub> needs alias", start)
            self.emit(Say(attrib["alias"], lexicons=False))
        elif name == "phoneme":
            if "ph" not in attrib:
                self._fail("<phoneme> needs ph", start)
            try:
                self.emit(Mark(self.phones.markup(attrib.get("alphabet", "ipa"), attrib["ph"]), text.strip()))
            except PronunciationError as exc:
                self._fail(f"<phoneme ph=\"{attrib['ph']}\">: {exc}", start)
        elif name == "say-as":
            kind = attrib.get("interpret-as")
            if kind is None:
                self._fail("<say-as> needs interpret-as", start)
            zh = (lang or "").lower().startswith("zh") or bool(_CHINESE.search(text))
            try:
                self.emit(Say(" " + say_as(kind, text, attrib.get("format"), zh) + " ", lexicons=False))
            except ValueError as exc:
                self._fail(f"<say-as>: {exc}", start)
        elif name in ("p", "s"):
            self.emit(Boundary())
        elif name == "prosody":
            self.rates.pop()
            self.emit(Boundary())
            self.emit(Rate(self.rates[-1]))
        elif name == "speak":
            self.closed = True
        self.leaf_text = []


def parser(emit: Callable[[Action], None], phones: PhoneSet, speed_ok: bool = True, speed_refusal: str = "",
           max_chars: int = MAX_SSML_CHARS) -> tuple[Parser, Interpreter]:
    """An incremental SSML parser: feed it text; close it at the end of the document."""
    interp = Interpreter(emit, phones, speed_ok, speed_refusal)
    return Parser(interp, max_chars, MAX_DEPTH, "SSML document"), interp


class PlanBuilder:
    """Actions into a plan: text between boundaries is one part (lexicons matched over it), pauses between."""

    def __init__(self, matcher: Matcher | None, phones: PhoneSet, speed: float = 1.0) -> None:
        self.matcher = matcher
        self.phones = phones
        self.base = speed
        self.speed = speed
        self.plan: Plan = []
        self.runs: list[Run] = []
        self.pending: list[str] = []  # the document's own text, matched against lexicons as one piece

    def _resolve(self) -> None:
        if self.pending:
            self.runs += apply_lexicons("".join(self.pending), self.matcher, self.phones)
            self.pending = []

    def _close(self) -> None:
        self._resolve()
        runs = merged(self.runs)
        if any(r.verbatim or r.text.strip() for r in runs):
            self.plan.append(Part(runs, self.speed))
        self.runs = []

    def __call__(self, action: Action) -> None:
        if isinstance(action, Say) and action.lexicons:
            self.pending.append(action.text)
            return
        self._resolve()
        if isinstance(action, Say):
            self.runs.append(Run(action.text))
        elif isinstance(action, Mark):
            self.runs.append(Run(action.markup, verbatim=True, shown=action.shown))
        elif isinstance(action, Rate):
            self._close()
            self.speed = self.base * action.speed
        else:
            self._close()
            if isinstance(action, Silence):
                if self.plan and isinstance(self.plan[-1], Pause):
                    self.plan[-1] = Pause(self.plan[-1].seconds + action.seconds)
                else:
                    self.plan.append(Pause(action.seconds))

    def finish(self) -> Plan:
        self._close()
        return self.plan


def build(document: str, matcher: Matcher | None, phones: PhoneSet, speed: float = 1.0, speed_ok: bool = True,
          speed_refusal: str = "") -> Plan:
    """A whole SSML document as a plan; SsmlError (or PronunciationError from a lexicon) says what is wrong."""
    builder = PlanBuilder(matcher, phones, speed)
    p, interp = parser(builder, phones, speed_ok, speed_refusal)
    try:
        p.feed(document)
        p.close_document()
    except XmlError as exc:
        raise SsmlError(str(exc)) from None
    if not interp.seen_root:
        raise SsmlError("the document is empty; send <speak>...</speak>")
    return builder.finish()
