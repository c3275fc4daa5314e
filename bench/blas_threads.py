"""The server's own matrix products (a clip's filterbanks, as voice registration computes them) with one
OpenBLAS thread and with two: wall and CPU seconds, each in a fresh process (the pool is sized at import).

    python -m bench.blas_threads [--threads 1 2] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORK = """
import json, resource, time, numpy as np
from cosyvoice_server.voices.spectral import prompt_mel, whisper_log_mel
a16 = np.random.default_rng(0).standard_normal(16000 * 30).astype(np.float32) * 0.1
a24 = np.random.default_rng(1).standard_normal(24000 * 30).astype(np.float32) * 0.1
whisper_log_mel(a16); prompt_mel(a24)
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range({repeat}):
    whisper_log_mel(a16); prompt_mel(a24)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"wall_s": round(time.perf_counter() - t0, 2),
                  "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2)}}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=20, help="30 s clips analysed per measurement")
    a = ap.parse_args()
    for n in a.threads:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": str(n), "OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}
        out = subprocess.run([sys.executable, "-c", WORK.format(repeat=a.repeat)], env=env, capture_output=True,
                             text=True, check=True).stdout
        print(json.dumps({"blas_threads": n, **json.loads(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
