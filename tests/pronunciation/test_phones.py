"""Pronunciations as phone markup: what the tokenizer holds decides, IPA maps only exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from cosyvoice3 import build_tokenizer
from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.pronunciation.phones import (PhoneSet, PronunciationError, cmu_phones, ipa_to_cmu, is_phone,
                                                   pinyin_phones)


@pytest.fixture(scope="module")
def cv3(tmp_path_factory) -> PhoneSet:
    return PhoneSet.of(Tokenizer.from_file(str(build_tokenizer(tmp_path_factory.mktemp("cv3")))))


@pytest.mark.parametrize("ipa, cmu", [
    ("maɪˈnjuːt", "M AY0 N Y UW1 T"),
    ("ˈmɪnɪt", "M IH1 N IH0 T"),
    ("kəˈmjuːnɪˌkeɪt", "K AH0 M Y UW1 N IH0 K EY2 T"),
    ("ˈt͡ʃɜ˞tʃ".replace("ɜ˞", "ɝ"), "CH ER1 CH"),
    ("ˈdʒʌdʒ", "JH AH1 JH"),
    ("ˈbɚ.ðɚ", "B ER1 DH ER0"),
    ("θɪŋk", "TH IH0 NG K"),
])
def test_ipa_maps_to_cmu_with_stress(ipa, cmu):
    assert ipa_to_cmu(ipa) == cmu.split()


@pytest.mark.parametrize("ipa, symbol", [("lɒt", "ɒ"), ("ˈbʌɾɚ", "ɾ"), ("bʌʔn̩", "ʔ"), ("ˈbɜːd", "ɜ")])
def test_ipa_without_an_exact_cmu_phone_is_refused_by_symbol(ipa, symbol):
    with pytest.raises(PronunciationError, match=f"'{symbol}'"):
        ipa_to_cmu(ipa)


def test_a_stress_mark_needs_a_vowel():
    with pytest.raises(PronunciationError, match="stress mark"):
        ipa_to_cmu("mɪnˈ")


def test_cmu_phones_are_checked():
    assert cmu_phones("m ay1 n uw1 t") == ["M", "AY1", "N", "UW1", "T"]
    for bad in ("M AY9", "Q", "T1"):
        with pytest.raises(PronunciationError):
            cmu_phones(bad)


@pytest.mark.parametrize("ph, phones", [
    ("jiā", ["j", "iā"]), ("jia1", ["j", "iā"]), ("he2", ["h", "é"]), ("hé", ["h", "é"]),
    ("zhong1 guo2", ["zh", "ōng", "g", "uó"]), ("lv4", ["l", "ǜ"]), ("lü4", ["l", "ǜ"]), ("xue2", ["x", "ué"]),
    ("ju3", ["j", "ǔ"]), ("gou3", ["g", "ǒu"]), ("liu2", ["l", "iú"]), ("de5", ["d", "e"]), ("er2", ["ér"]),
    ("ān", ["ān"]), ("shuǐ", ["sh", "uǐ"]),
])
def test_pinyin_initials_and_toned_finals(ph, phones):
    assert pinyin_phones(ph) == phones


@pytest.mark.parametrize("bad", ["jiā1", "ji1a2", "x7", "hǎó"])
def test_malformed_pinyin_is_refused(bad):
    with pytest.raises(PronunciationError):
        pinyin_phones(bad)


def test_alphabets_come_from_the_tokenizer(cv3):
    assert cv3.alphabets == ["ipa", "x-cmu", "x-pinyin"]
    tiny = PhoneSet.of(Tokenizer.from_file(str(Path(BUNDLED_MODEL) / "tokenizer.json")))
    assert tiny.alphabets == []
    with pytest.raises(PronunciationError, match="its tokenizer has no phone tokens"):
        tiny.markup("x-cmu", "M AY1")


def test_markup_is_the_tokenizers_phone_tokens(cv3):
    assert cv3.markup("x-cmu", "M AY1 N UW1 T") == "[M][AY1][N][UW1][T]"
    assert cv3.markup("x-pinyin", "jia1 he2") == "[j][iā][h][é]"
    assert cv3.markup("ipa", "maɪ") == "[M][AY0]"
    assert cv3.markup("x-pinyin", "lüe4") == "[l][vè]"  # this tokenizer writes that final with v
    with pytest.raises(PronunciationError, match=r"no phone token \[ēr\]"):
        cv3.markup("x-pinyin", "er1")
    with pytest.raises(PronunciationError, match="not one this server reads"):
        cv3.markup("x-sampa", "m aI")


def test_phone_tokens_are_not_tags():
    assert all(is_phone(t) for t in ("[AY1]", "[M]", "[j]", "[iā]", "[ǚ]", "[vè]", "[ér]"))
    assert not any(is_phone(t) for t in ("[breath]", "[noise]", "[mn]", "[sigh]", "[cough]", "<strong>"))
