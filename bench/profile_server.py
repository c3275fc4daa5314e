"""Where the server's time goes under load: py-spy samples every thread of a real server process
while the load generator drives it, then prints the hottest leaf functions per thread.

    .venv/bin/python -m bench.profile_server --concurrency 16 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import tempfile
from pathlib import Path

from cosyvoice_server.config import BUNDLED_MODEL

from .loadgen import closed_loop
from .run import TEXT, Server


def summarize(raw: Path, top: int) -> str:
    """py-spy's raw format: 'thread (tid): name;frame;...;frame count', a frame being 'func (file:line)'.
    Idle frames (waiting on a condition or a selector) are kept: they show how busy each thread is."""
    by_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        head, _, rest = stack.partition(": ")
        frames = rest.split(";")
        thread = frames[0]
        leaf = frames[-1] if len(frames) > 1 else "(no Python frame)"
        by_thread[thread][leaf] += int(count)
        totals[thread] += int(count)
    lines = []
    for thread, n in totals.most_common():
        lines.append(f"{thread}: {n} samples")
        for frame, c in by_thread[thread].most_common(top):
            lines.append(f"  {100 * c / n:5.1f}%  {frame}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--out", default=None, help="also write the summary here")
    args = ap.parse_args()
    server = Server(BUNDLED_MODEL, "cpu", "--max-batch-size", "16")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "profile.txt"
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking", "--threads",
                                    "--idle", "-r", "100", "-d", str(int(args.seconds)), "-f", "raw", "-o", str(raw),
                                    "-p", str(server.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            asyncio.run(closed_loop(server.url, args.concurrency, args.seconds, TEXT, True, warmup=0))
            spy.wait(60)
            text = summarize(raw, args.top)
    finally:
        server.stop()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
