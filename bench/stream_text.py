"""What a WebSocket session's text costs the server: deltas of one character (a word that never ends, a
clause without punctuation) and messages of the largest size, with a model's tokenizer.

    python -m bench.stream_text [--model-dir DIR] [--chars 2000 8000]

Reported per case: seconds of tokenizing, and, for the largest message tokenized on a thread as the server
does, the longest another thread waited for the interpreter meanwhile (what the event loop would wait).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from tokenizers import Tokenizer

from cosyvoice_server.config import BUNDLED_MODEL, Settings
from cosyvoice_server.streamtext import StreamTokenizer

RUNS = {"latin": "a", "cjk": "中"}


def per_char(tok: Tokenizer, ch: str, n: int) -> float:
    st, t0 = StreamTokenizer(tok), time.perf_counter()
    for _ in range(n):
        st.push(ch)
    return time.perf_counter() - t0


def largest_message(tok: Tokenizer, text: str) -> tuple[float, float]:
    """(seconds to tokenize `text` on a thread, the longest gap a 1 ms ticker thread saw meanwhile)."""
    gaps, done = [0.0], threading.Event()

    def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    th = threading.Thread(target=ticker)
    th.start()
    t0 = time.perf_counter()
    StreamTokenizer(tok).push(text)
    took = time.perf_counter() - t0
    done.set()
    th.join()
    return took, max(gaps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=BUNDLED_MODEL)
    ap.add_argument("--chars", type=int, nargs="+", default=[2000, 8000])
    a = ap.parse_args()
    tok = Tokenizer.from_file(str(a.model_dir / "tokenizer.json"))
    limit = Settings.model_fields["max_body_bytes"].default
    for name, ch in RUNS.items():
        for n in a.chars:
            print(json.dumps({"case": f"{n} one-character deltas ({name})", "seconds": round(per_char(tok, ch, n), 3)}))
        text = ch * (limit // len(ch.encode()) - 64)  # one message under --max-body-bytes, JSON framing aside
        took, gap = largest_message(tok, text)
        print(json.dumps({"case": f"one {len(text.encode())}-byte message ({name})", "seconds": round(took, 3),
                          "longest_wait_other_thread_s": round(gap, 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
