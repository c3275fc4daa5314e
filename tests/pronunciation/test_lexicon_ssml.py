"""PLS lexicons, the SSML subset and plans: pure functions, read as a user's documents are."""

from __future__ import annotations

import time

import pytest

from cosyvoice_server.pronunciation import ssml
from cosyvoice_server.pronunciation.lexicon import LexiconError, Matcher, parse_pls
from cosyvoice_server.pronunciation.phones import CMU_CONSONANTS, CMU_VOWELS, PhoneSet, PronunciationError
from cosyvoice_server.pronunciation.plan import Part, Pause, Run, StreamLexicon, apply_lexicons, plain

NONE = PhoneSet(frozenset())  # a model without phone tokens (CosyVoice2)
CMU = PhoneSet(frozenset([f"[{c}]" for c in CMU_CONSONANTS] + [f"[{v}{s}]" for v in CMU_VOWELS for s in "012"]))


def pls(body: str, alphabet: str = "x-cmu", name: str = "test") -> Matcher:
    return Matcher((parse_pls(name, f'<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" '
                                    f'alphabet="{alphabet}" xml:lang="en-US">{body}</lexicon>'),))


def lexeme(grapheme: str, alias: str) -> str:
    return f"<lexeme><grapheme>{grapheme}</grapheme><alias>{alias}</alias></lexeme>"


def said(text: str, matcher: Matcher, phones: PhoneSet = NONE) -> str:
    return "".join(r.text for r in apply_lexicons(text, matcher, phones))


def test_alias_replaces_whole_words_only():
    m = pls(lexeme("AI", "artificial intelligence"))
    assert said("AI, and AI.", m) == "artificial intelligence, and artificial intelligence."
    assert said("FAIR AIs MAIL", m) == "FAIR AIs MAIL"  # never inside a longer word
    assert said("ai", m) == "ai"  # graphemes match as written, case and all


def test_longest_grapheme_first_and_whitespace_in_graphemes():
    m = pls(lexeme("New York", "the big apple") + lexeme("New", "brand-new") + lexeme("New York City", "NYC"))
    assert said("New York City and New  York\nand New Jersey", m) == "NYC and the big apple\nand brand-new Jersey"


def test_chinese_graphemes_match_where_they_stand():
    m = pls(lexeme("重庆", "崇庆"), alphabet="x-pinyin")
    assert said("我去重庆了", m) == "我去崇庆了"


def test_earlier_lexicons_win_and_prefer_picks_a_pronunciation():
    a = parse_pls("a", '<lexicon version="1.0" alphabet="x-cmu">' + lexeme("SQL", "sequel") + "</lexicon>")
    b = parse_pls("b", '<lexicon version="1.0" alphabet="x-cmu">' + lexeme("SQL", "S Q L") + "</lexicon>")
    assert said("SQL", Matcher((b, a))) == "S Q L"
    c = parse_pls("c", '<lexicon version="1.0"><lexeme><grapheme>GIF</grapheme><alias>gif</alias>'
                       '<alias prefer="true">jif</alias></lexeme></lexicon>')
    assert said("GIF", Matcher((c,))) == "jif"


def test_phoneme_rules_become_markup_or_a_refusal_naming_the_lexeme():
    m = pls("<lexeme><grapheme>Qwen</grapheme><phoneme>K W EH1 N</phoneme></lexeme>")
    runs = apply_lexicons("Try Qwen now", m, CMU)
    assert runs == [Run("Try "), Run("[K][W][EH1][N]", verbatim=True, shown="Qwen"), Run(" now")]
    with pytest.raises(PronunciationError, match="lexeme 'Qwen'.*cannot take 'x-cmu'"):
        apply_lexicons("Try Qwen now", m, NONE)


@pytest.mark.parametrize("doc, problem", [
    ("<lexicon><lexeme><alias>x</alias></lexeme></lexicon>", "no <grapheme>"),
    ("<lexicon><lexeme><grapheme>x</grapheme></lexeme></lexicon>", "no <phoneme> or <alias>"),
    ("<lexicon><lexeme><grapheme>x</grapheme><phoneme>M</phoneme></lexeme></lexicon>", "without an alphabet"),
    ("<lexicon><speak/></lexicon>", "cannot be inside <lexicon>"),
    ('<!DOCTYPE l [<!ENTITY a "b">]><lexicon/>', "DTD"),
    ("<lexicon>", "not well-formed"),
])
def test_bad_lexicons_are_refused_with_their_reason(doc, problem):
    with pytest.raises(LexiconError, match=problem):
        parse_pls("bad", doc)


def test_streamed_text_gets_the_same_runs_whatever_the_pieces():
    m = pls(lexeme("W3C", "World Wide Web Consortium") + lexeme("New York", "NYC") +
            "<lexeme><grapheme>Qwen</grapheme><phoneme>K W EH1 N</phoneme></lexeme>")
    text = "The W3C met in New York; W3Cs and Qwen. Qwen W3C"
    whole = apply_lexicons(text, m, CMU)
    for step in (1, 2, 3, 5, 7):
        stream = StreamLexicon(m, CMU)
        runs = [r for i in range(0, len(text), step) for r in stream.push(text[i:i + step])] + stream.flush()
        assert "".join(r.text for r in runs) == "".join(r.text for r in whole)
        assert [r for r in runs if r.verbatim] == [r for r in whole if r.verbatim]


DOC = """<speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis" xml:lang="en-US">
<p><s>Hello there.</s><s>The <sub alias="World Wide Web Consortium">W3C</sub> met.</s></p>
<break time="700ms"/><break strength="weak"/>
Call <say-as interpret-as="telephone">+1 555-0100</say-as> on <say-as interpret-as="date" format="mdy">12/25/2024</say-as>.
<prosody rate="150%">Fast <say-as interpret-as="characters">IBM</say-as>.</prosody>
</speak>"""


def test_ssml_becomes_parts_and_pauses():
    plan = ssml.build(DOC, None, NONE)
    texts = [" ".join("".join(r.text for r in p.runs).split()) if isinstance(p, Part) else p for p in plan]
    assert texts == ["Hello there.", "The World Wide Web Consortium met.", Pause(1.2),
                     "Call plus 1, 5 5 5, 0 1 0 0 on December 25, 2024 .", "Fast I B M ."]
    assert [p.speed for p in plan if isinstance(p, Part)] == [1.0, 1.0, 1.0, 1.5]


@pytest.mark.parametrize("doc, problem", [
    ("<speak>\n\n<emphasis>hi</emphasis></speak>", r"<emphasis> is not supported.*\(line 3\)"),
    ("<speak><prosody pitch='high'>x</prosody></speak>", "does not take the attribute 'pitch'"),
    ("<speak><break time='20s'/></speak>", "longer than the 10 s"),
    ("<speak><break time='soon'/></speak>", "700ms or 1.5s"),
    ("<speak><say-as interpret-as='cardinal'>many</say-as></speak>", "needs a number"),
    ("<speak><say-as interpret-as='date' format='mdy'>13/40/2024</say-as></speak>", "not a date"),
    ("<speak><sub alias='a'><s>x</s></sub></speak>", "takes text only"),
    ("<p>x</p>", "must be a <speak>"),
    ("<speak><phoneme alphabet='ipa' ph='mɪ'>me</phoneme></speak>", "cannot take 'ipa'"),
    ("<speak><prosody rate='x-fast'><prosody rate='400%'>x</prosody></prosody></speak>", "within 0.25-4"),
    ("", "not well-formed"),
])
def test_ssml_refusals_name_the_element_and_line(doc, problem):
    with pytest.raises(ssml.SsmlError, match=problem):
        ssml.build(doc, None, NONE)


def test_prosody_is_refused_where_speed_cannot_change():
    with pytest.raises(ssml.SsmlError, match="<prosody rate> not here"):
        ssml.build("<speak><prosody rate='slow'>x</prosody></speak>", None, NONE, speed_ok=False,
                   speed_refusal="not here")


def test_lang_becomes_the_models_language_token_where_it_has_one():
    with_lang = PhoneSet(frozenset({"<|en|>"}))
    plan = ssml.build("<speak><lang xml:lang='en-GB'>colour</lang> <lang xml:lang='fr'>oui</lang></speak>", None,
                      with_lang)
    assert plan == [Part((Run("<|en|>", verbatim=True), Run("colour oui")))]


def test_lexicons_apply_to_the_documents_words_not_to_aliases():
    m = pls(lexeme("SQL", "sequel"))
    plan = ssml.build("<speak>SQL <sub alias='SQL'>x</sub></speak>", m, NONE)
    assert "".join(r.text for r in plan[0].runs) == "sequel SQL"


HOSTILE = {
    "billion laughs": '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">' + "".join(
        f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(9)) + "]><speak>&j;</speak>",
    "external entity": '<?xml version="1.0"?><!DOCTYPE s [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>',
    "external DTD": '<!DOCTYPE speak SYSTEM "http://example.com/x.dtd"><speak>x</speak>',
    "undeclared entity": "<speak>&x;</speak>",
    "nesting past the depth cap": "<speak>" + "<s>" * 5_000 + "x" + "</s>" * 5_000 + "</speak>",
    "nesting past the size cap": "<speak>" + "<s>" * 100_000 + "x" + "</s>" * 100_000 + "</speak>",
    "10 MB of nesting": "<speak>" + "<p>" * 3_500_000,
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_xml_is_refused_in_milliseconds(name):
    t0 = time.perf_counter()
    with pytest.raises(ssml.SsmlError):
        ssml.build(HOSTILE[name], None, NONE)
    assert time.perf_counter() - t0 < 0.05


def test_plain_text_is_one_part():
    assert plain("Hi.", None, NONE, 1.25) == [Part((Run("Hi."),), 1.25)]
