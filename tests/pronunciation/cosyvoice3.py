"""A CosyVoice3 tokenizer built as upstream builds it (`CosyVoice3Tokenizer`: the BlankEN BPE of the golden
checkpoint plus its added tokens), saved as the HF `tokenizers` file the server loads, and upstream's text ids
for markup texts (`../shared/golden/cosyvoice3/tokenizer.json`). Tests skip where the golden data is absent."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from cosyvoice_server.convert.tokens import special_tokens

GOLDEN = Path(__file__).resolve().parents[3] / "shared" / "golden" / "cosyvoice3"


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
    tok.add_special_tokens(special_tokens("cosyvoice3"))
    with tempfile.TemporaryDirectory() as tmp:
        tok.backend_tokenizer.save(f"{tmp}/tokenizer.json")
        return Path(f"{tmp}/tokenizer.json").read_bytes()


def upstream_ids() -> dict[str, list[int]]:
    data = json.loads((need_golden() / "tokenizer.json").read_text())
    return {c["text"]: c["ids"] for c in data["cases"]}
