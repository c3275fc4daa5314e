"""Plans through the real frontend (the tiny model's tokenizer and CosyVoice3's), segment timing, and the
lexicon directory as the kubelet updates a ConfigMap volume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cosyvoice3 import build_tokenizer, upstream_ids
from kubelet import kubelet_write
from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.frontend import Spoken, TextFrontend
from cosyvoice_server.lexicons import LexiconStore
from cosyvoice_server.pronunciation import ssml
from cosyvoice_server.pronunciation.lexicon import Matcher, parse_pls
from cosyvoice_server.pronunciation.plan import Pause, plain
from cosyvoice_server.timeline import Timeline

PLS = ('<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="{alphabet}">'
       "{body}</lexicon>")


@pytest.fixture(scope="module")
def tiny() -> TextFrontend:
    return TextFrontend(Path(BUNDLED_MODEL) / "tokenizer.json", 80)


@pytest.fixture(scope="module")
def cv3(tmp_path_factory) -> TextFrontend:
    return TextFrontend(build_tokenizer(tmp_path_factory.mktemp("cv3")), 80)


def ids(items) -> list[list[int]]:
    return [list(x.ids) for x in items if isinstance(x, Spoken)]


@pytest.mark.parametrize("text", ["In 2024, 3 cats ate 12.5 kg. Then they slept!", "他说：“你好！”然后走了……",
                                  "A sentence without an end " * 30])
def test_plain_text_segments_as_before(tiny, text):
    assert ids(tiny.plan_segments(plain(text, None, tiny.phones))) == [list(s) for s in tiny.segments(text)]


def test_an_alias_reads_exactly_as_its_text(tiny):
    m = Matcher((parse_pls("b", PLS.format(alphabet="ipa", body="<lexeme><grapheme>W3C</grapheme>"
                                           "<alias>World Wide Web Consortium</alias></lexeme>")),))
    got = tiny.plan_segments(plain("The W3C met on 3 May.", m, tiny.phones))
    assert ids(got) == [list(s) for s in tiny.segments("The World Wide Web Consortium met on 3 May.")]


def test_phone_markup_reaches_the_model_as_upstream_encodes_it(cv3):
    """Upstream's ids for the same markup text (its frontend with text_frontend=False) from the golden data."""
    golden = upstream_ids()
    doc = '<speak>say <phoneme alphabet="x-cmu" ph="M AY1 N UW1 T">minute</phoneme> please, not minute.</speak>'
    got = cv3.plan_segments(ssml.build(doc, None, cv3.phones))
    assert ids(got) == [golden["say [M][AY1][N][UW1][T] please, not minute."]]
    assert got[0].text == "say minute please, not minute."  # the segment shows the word, not its phones
    zh = Matcher((parse_pls("zh", PLS.format(alphabet="x-pinyin", body="<lexeme><grapheme>家</grapheme>"
                                             "<phoneme>jia1</phoneme></lexeme><lexeme><grapheme>河</grapheme>"
                                             "<phoneme>há</phoneme></lexeme>")),))
    assert ids(cv3.plan_segments(plain("我们家在河边。", zh, cv3.phones))) == [golden["我们[j][iā]在[h][á]边。"]]


def test_markup_is_never_normalized(cv3):
    """wetext and the number speller would read [AY1] as 'AY one'; around markup only the text is normalized."""
    doc = '<speak>I have 3 <phoneme alphabet="x-cmu" ph="M AY1 N UW1 T S">minutes</phoneme> left.</speak>'
    got = cv3.plan_segments(ssml.build(doc, None, cv3.phones))
    assert cv3.tokenizer.decode(list(got[0].ids), skip_special_tokens=False) == \
        "I have three [M][AY1][N][UW1][T][S] left."


def test_segments_tile_the_audio_with_breaks_in_place():
    items = [Pause(0.5), Spoken(np.zeros(3, np.int64), "One."), Spoken(np.zeros(3, np.int64), "Two, long."),
             Spoken(np.zeros(3, np.int64), "", continued=True), Pause(0.7), Pause(0.1)]
    t = Timeline(items, 24000)
    lead, events = t.begin()
    assert len(lead) == 12000 and events == [{"text": "", "start_s": 0.0, "end_s": 0.5}]
    t.audio(24000)
    silence, events = t.segment_end()
    assert len(silence) == 0 and [e["text"] for e in events] == ["One."]
    t.audio(1000)
    silence, events = t.segment_end()
    assert len(silence) == 0 and events == []  # the next piece continues it: not yet
    t.audio(2000)
    silence, events = t.segment_end()
    assert len(silence) == 19200
    assert [(e["text"], e["start_s"], e["end_s"]) for e in events] == [
        ("Two, long.", 1.5, 1.625), ("", 1.625, 2.325), ("", 2.325, 2.425)]


def test_a_changed_configmap_volume_is_read_again(tmp_path):
    volume = tmp_path / "lexicons" / "brands"
    alias = '<lexeme><grapheme>W3C</grapheme><alias>{}</alias></lexeme>'
    kubelet_write(volume, {"brands.pls": PLS.format(alphabet="ipa", body=alias.format("first"))}, 1)
    store = LexiconStore(tmp_path / "lexicons", ["brands"])
    assert store.matcher(None).rules["W3C"].value == "first"
    assert not store.reload()
    kubelet_write(volume, {"brands.pls": PLS.format(alphabet="ipa", body=alias.format("second"))}, 2)
    assert store.reload()
    assert store.matcher(None).rules["W3C"].value == "second"
    kubelet_write(volume, {"brands.pls": "<lexicon"}, 3)  # broken: the last good version stays in use
    assert store.reload()
    assert store.matcher(["brands"]).rules["W3C"].value == "second"
    assert "not well-formed" in store.entries["brands"].error
    with pytest.raises(KeyError):
        store.matcher(["places"])
    assert store.matcher([]) is None
