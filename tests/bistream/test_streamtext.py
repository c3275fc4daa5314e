"""Streamed text gives the same text tokens whatever its split: mid-word, per character, whole, across
special tokens, combining characters and whitespace runs; and they are the whole text's tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.frontend import normalize
from cosyvoice_server.streamtext import StreamTokenizer

# Qwen2's own normalizer and pre-tokenizer (its tokenizer.json), put on the miniature's vocabulary.
QWEN2_PRETOKENIZER = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {"Regex": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")}},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}

TEXTS = [
    "Hello world, this is a small test of speech synthesis.",
    "It's 12.50 dollars -- isn't it?! They'll say: \"we've done 1,000,000 runs\"...",
    "[breath] Well, <strong>this</strong> matters [laughter] a lot.[breath]",
    "  leading and   trailing\n\nwhitespace,\ttabs\u0000 and control\x07 characters   ",
    "Cafe\u0301 cre\u0300me bru\u0302le\u0301e, naïve coöperation",
    "今天是个好日子，我们一起去公园散步吧！天气预报说下午会下雨。",
    "Mixed 中文 and English: 第3章, chapter three; émigré 🙂 emoji👍🏽 done",
    "[bre ath] not a tag, [breathe] neither, <strong nor this",
]


@pytest.fixture(scope="module", params=["tiny", "miniature", "miniature+qwen2-pretokenizer"])
def tokenizer(request) -> Tokenizer:
    if request.param == "tiny":
        return Tokenizer.from_file(str(BUNDLED_MODEL / "tokenizer.json"))
    spec = json.loads((request.getfixturevalue("converted") / "tokenizer.json").read_text())
    if request.param.endswith("qwen2-pretokenizer"):
        spec["normalizer"] = {"type": "NFC"}
        spec["pre_tokenizer"] = QWEN2_PRETOKENIZER
    return Tokenizer.from_str(json.dumps(spec))


def stream(tok: Tokenizer, parts: list[str | None]) -> list[list[int]]:
    """Token ids per segment; None in `parts` is a flush."""
    st = StreamTokenizer(tok)
    segments, current = [], []
    for p in [*parts, None]:
        if p is None:
            current += st.flush()
            segments.append(current)
            current = []
        else:
            current += st.push(p)
    return segments


def splits(text: str, rng: np.random.Generator, n: int) -> list[list[str]]:
    out = [[text], list(text), [w + " " for w in text.split(" ")[:-1]] + [text.split(" ")[-1]]]
    for _ in range(n):
        k = int(rng.integers(1, max(2, len(text) // 2)))
        cuts = sorted(set(rng.integers(0, len(text) + 1, k).tolist()) | {0, len(text)})
        out.append([text[a:b] for a, b in zip(cuts, cuts[1:])])  # empty deltas included
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_any_split_gives_the_whole_texts_tokens(tokenizer, text):
    want = tokenizer.encode(normalize(text), add_special_tokens=False).ids
    for parts in splits(text, np.random.default_rng(len(text)), 40):
        assert stream(tokenizer, parts) == [want], parts


def test_flush_cuts_segments_and_each_is_tokenized_on_its_own(tokenizer):
    a, b = TEXTS[0], TEXTS[2]
    want = [tokenizer.encode(normalize(t), add_special_tokens=False).ids for t in (a, b)]
    for parts_a, parts_b in zip(splits(a, np.random.default_rng(1), 10), splits(b, np.random.default_rng(2), 10)):
        assert stream(tokenizer, [*parts_a, None, *parts_b]) == want


def test_tokens_commit_as_soon_as_a_word_is_complete(tokenizer):
    st = StreamTokenizer(tokenizer)
    assert st.push("Hel") == []  # a word being typed may still grow
    assert st.push("lo") == []
    first = st.push(" wor")  # "Hello" cannot change any more
    assert first == tokenizer.encode("Hello", add_special_tokens=False).ids
    assert st.held == " wor"


def test_a_special_token_split_across_deltas_is_kept_whole(converted):
    tok = Tokenizer.from_file(str(converted / "tokenizer.json"))
    breath = tok.token_to_id("[breath]")
    st = StreamTokenizer(tok)
    got = st.push("Hi [bre") + st.push("ath") + st.push("] there") + st.flush()
    assert breath in got
    assert got == tok.encode("Hi [breath] there", add_special_tokens=False).ids


def test_whitespace_only_and_empty_flushes_commit_nothing(tokenizer):
    assert stream(tokenizer, ["   ", "\n\t", None, ""]) == [[], []]


def test_text_without_flushes_is_cut_at_sentence_ends_whatever_the_split(tokenizer):
    from cosyvoice_server.scheduling.request import TextFeed

    text = ("First sentence is here. It costs 3.5 dollars, e.g. this much! Then: a third one goes on and on? "
            "今天天气很好。我们去公园吧！Done")

    def segments(parts):
        f = TextFeed(StreamTokenizer(tokenizer), 60.0, segment_tokens=8)
        for p in parts:
            f.push(p)
        f.end()
        out, i = [], 0
        while (seg := f.segment(i)) is not None:
            out.append((tokenizer.decode(seg[0]), f.info(i).auto))
            i += 1
        return out

    want = segments([text])
    assert len(want) >= 4 and all(auto for _, auto in want[:-1]) and not want[-1][1]
    assert "".join(t for t, _ in want).replace(" ", "") == normalize(text).replace(" ", "")
    # cut after sentence punctuation only ("3.5" and "e.g." followed by a letter go on)
    assert all(t.rstrip().endswith((".", "!", "?", ":", "。", "！")) for t, _ in want[:-1])
    assert not any(t.rstrip().endswith("3.") for t, _ in want)
    for parts in splits(text, np.random.default_rng(7), 15):
        assert segments(parts) == want


def test_text_without_a_sentence_end_is_cut_at_the_segment_cap_whatever_the_split(tokenizer):
    from cosyvoice_server.scheduling.request import TextFeed

    text = "word " * 300  # no punctuation: no sentence end to cut at

    def segments(parts):
        f = TextFeed(StreamTokenizer(tokenizer), 60.0, segment_tokens=8, max_tokens=40)
        for p in parts:
            f.push(p)
        f.end()
        out, i = [], 0
        while (seg := f.segment(i)) is not None:
            out.append((seg[0], f.info(i).auto))
            i += 1
        return out

    want = segments([text])
    assert len(want) > 1 and all(len(t) == 40 and auto for t, auto in want[:-1]) and not want[-1][1]
    assert 0 < len(want[-1][0]) <= 40
    assert sum((t for t, _ in want), []) == tokenizer.encode(normalize(text), add_special_tokens=False).ids
    for parts in splits(text, np.random.default_rng(3), 5):
        assert segments(parts) == want


LONG_RUNS = [
    "a" * 1000,
    "今天天气很好我们一起去公园散步吧" * 20 + "。然后回家",
    "Supercalifragilisticexpialidocious" * 6 + " and then a normal sentence.",
    "[breath]" + "b" * 200 + "[laughter]" + "c" * 130,
]


@pytest.mark.parametrize("text", LONG_RUNS)
def test_an_unbroken_run_is_committed_in_bounded_runs_whatever_the_split(tokenizer, text):
    from cosyvoice_server.streamtext import RUN_CHARS

    want = stream(tokenizer, [text])
    assert tokenizer.decode(want[0], skip_special_tokens=False) == normalize(text)  # nothing lost or added at the run cuts
    longest_added = max((len(t.content) for t in tokenizer.get_added_tokens_decoder().values()), default=0)
    st, first_at = StreamTokenizer(tokenizer), None
    for i, ch in enumerate(text):
        if st.push(ch) and first_at is None:
            first_at = i
        # what is held back (and re-tokenized by every delta) stays bounded, however long the run
        assert len(st.held) <= RUN_CHARS + longest_added
    assert first_at is not None and first_at <= RUN_CHARS + longest_added  # the first words go out before the run ends
    for parts in splits(text, np.random.default_rng(len(text)), 20):
        assert stream(tokenizer, parts) == want, parts
