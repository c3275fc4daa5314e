"""A CosyVoice3 tokenizer built as upstream builds it (`CosyVoice3Tokenizer`: the BlankEN BPE of the golden
checkpoint plus its added tokens), saved as the HF `tokenizers` file the server loads, and upstream's text ids
for markup texts (`../shared/golden/cosyvoice3/tokenizer.json`). Tests skip where the golden data is absent."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from cosyvoice_server.pronunciation.phones import CMU_CONSONANTS, CMU_VOWELS

GOLDEN = Path(__file__).resolve().parents[3] / "shared" / "golden" / "cosyvoice3"

# CosyVoice3's added tokens after CosyVoice2's: <|endofsystem|>, then the ARPAbet phones and the pinyin initials
# and toned finals its training data has: the phones alphabetically, each vowel bare then with stress 0-2,
# and the pinyin in code point order (which is what puts [M] at 151718 and [j] at 151797).
_CV2 = ["<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]", "[laughter]",
        "[cough]", "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]",
        "[vocalized-noise]", "[lipsmack]", "[mn]"]
_PINYIN = """a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng
ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u uang ue un uo uà
uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh à ài
àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē
ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ""".split()


def added_tokens() -> list[str]:
    cmu = [f"[{p}{s}]" for p in sorted(CMU_VOWELS + CMU_CONSONANTS)
           for s in (("", "0", "1", "2") if p in CMU_VOWELS else ("",))]
    return _CV2 + ["<|endofsystem|>"] + cmu + sorted(f"[{p}]" for p in _PINYIN)


def need_golden() -> Path:
    if not (GOLDEN / "tokenizer.json").is_file():
        pytest.skip(f"the CosyVoice3 golden data is not at {GOLDEN}")
    return GOLDEN


def build_tokenizer(out: Path) -> Path:
    """tokenizer.json of CosyVoice3 (transformers reads the BlankEN files, as upstream's AutoTokenizer does)."""
    golden = need_golden()
    pytest.importorskip("transformers", reason="transformers (the convert extra) builds the tokenizer")
    path = out / "tokenizer.json"
    path.write_bytes(_built(str(golden)))
    return path


@functools.cache
def _built(golden: str) -> bytes:
    """Built once per process (a second or two): the bytes of its tokenizer.json."""
    import tempfile

    import transformers

    golden = Path(golden)
    tok = transformers.AutoTokenizer.from_pretrained(str(golden / "ckpt" / "CosyVoice-BlankEN"))
    tok.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                            "additional_special_tokens": added_tokens()})
    with tempfile.TemporaryDirectory() as tmp:
        tok.backend_tokenizer.save(f"{tmp}/tokenizer.json")
        return Path(f"{tmp}/tokenizer.json").read_bytes()


def upstream_ids() -> dict[str, list[int]]:
    data = json.loads((need_golden() / "tokenizer.json").read_text())
    return {c["text"]: c["ids"] for c in data["cases"]}
