"""The special tokens upstream's text tokenizers add to the CosyVoice-BlankEN (Qwen2) tokenizer, in the order
that gives them their ids (`CosyVoice2Tokenizer` and `CosyVoice3Tokenizer`, cosyvoice/tokenizer/tokenizer.py,
whose module imports whisper and tiktoken, so the lists are kept here).

CosyVoice3 adds `<|endofsystem|>`, the CMU phones (ARPAbet; vowels bare and with stress 0, 1, 2) and pinyin
initials and finals (toneless and tone-marked) that a text may carry in brackets to fix a pronunciation:
`[M][AY1][N][UW1][T]`, `[j][iā]`.
"""

from __future__ import annotations

from ..pronunciation.phones import CMU_CONSONANTS, CMU_VOWELS

COSYVOICE2 = [
    "<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]", "[laughter]",
    "[cough]", "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]",
    "[vocalized-noise]", "[lipsmack]", "[mn]",
]

CMU_PHONES = sorted([v + stress for v in CMU_VOWELS for stress in ("", "0", "1", "2")] + list(CMU_CONSONANTS))

# The pinyin pieces CosyVoice3's vocabulary has: initials, toneless finals, and the tone-marked finals its
# training text used (not every syllable of Mandarin has each tone).
PINYIN = sorted("""
    b c ch d f g h j k l m n p q r s sh t w x y z zh
    a ai an ang ao e ei en eng i ian in ing iu o ong ou u uang ue un uo
    ià iàn iàng iào iá ián iáng iáo iè ié iòng ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ
    uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi uǎn uǎng uǐ uǒ vè
    à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún
    ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ
""".split())

COSYVOICE3 = COSYVOICE2 + ["<|endofsystem|>"] + [f"[{p}]" for p in CMU_PHONES] + [f"[{p}]" for p in PINYIN]


def special_tokens(family: str) -> dict:
    """The `add_special_tokens` argument upstream's tokenizer class for `family` passes."""
    return {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
            "additional_special_tokens": COSYVOICE3 if family == "cosyvoice3" else COSYVOICE2}
