"""Start-up time: from `cosyvoice-server serve` to /healthz (the process is up) and to /readyz (the model
loaded, the text workers started, one warm-up synthesis through every stage).

    .venv/bin/python -m bench.startup --runs 5

A replica's cold start is this plus the image pull and, on a GPU, session creation; a scale-up waits for
it. Prints the median and the range of each over the runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx

from cosyvoice_server.config import BUNDLED_MODEL

from .run import Server


def one_start(model_dir: str, device: str, args: list[str]) -> tuple[float, float]:
    """(seconds to /healthz, seconds to /readyz) for one start."""
    t0 = time.monotonic()
    server = Server(model_dir, device, *args, wait=False)
    up = None
    try:
        with httpx.Client(base_url=server.url, timeout=1) as client:
            while server.proc.poll() is None:
                try:
                    if up is None and client.get("/healthz").status_code == 200:
                        up = time.monotonic() - t0
                    if client.get("/readyz").status_code == 200:
                        return up if up is not None else time.monotonic() - t0, time.monotonic() - t0
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)  # polling faster would take CPU from the start-up it measures
        raise RuntimeError(f"the server exited with {server.proc.returncode} during start-up")
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model-dir", default=str(BUNDLED_MODEL))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("server_args", nargs="*", help="more `serve` flags, after --")
    a = ap.parse_args()
    runs = [one_start(a.model_dir, a.device, a.server_args) for _ in range(a.runs)]
    for name, values in (("process up (/healthz)", [r[0] for r in runs]), ("ready (/readyz)", [r[1] for r in runs])):
        print(f"{name:24s} median {statistics.median(values):5.2f} s  (min {min(values):.2f}, max {max(values):.2f}, "
              f"{len(values)} runs)")


if __name__ == "__main__":
    main()
