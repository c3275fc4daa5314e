"""Text that wetext's tagger cannot take (control characters, private-use planes) is spoken as written,
never a 500: found by the OpenAPI fuzz run."""

from __future__ import annotations

import numpy as np

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.frontend import TextFrontend
from cosyvoice_server.model.manifest import validate_model_dir


def test_odd_characters_never_break_normalization():
    m = validate_model_dir(BUNDLED_MODEL)
    f = m.frontend
    fe = TextFrontend(BUNDLED_MODEL / f.tokenizer, f.max_text_tokens_per_segment, f.min_text_tokens_per_segment,
                      f.merge_text_tokens, f.text_frontend)
    found = "\x04¼\t\x91)U\U000add54+¢5\U000f3fbc\U0008098bñxýå\x8d\x05"
    assert fe.normalized(found) and fe.segments(found)
    rng = np.random.default_rng(0)
    pool = [chr(c) for c in (*range(0, 32), *range(0x80, 0xa0), 0xad, 0x200b, 0xfeff, 0xe000, 0xf0000)] + list("aZ5+.,")
    for _ in range(300):
        text = "".join(rng.choice(pool, int(rng.integers(1, 12))))
        fe.segments(text)  # raises nothing
