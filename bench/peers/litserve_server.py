"""The request-level batch pipeline hosted in LitServe, for side-by-side comparison.

    python -m bench.peers.litserve_server --port 8100 --max-batch-size 16 --batch-timeout-ms 5

POST /predict {"input": str, "seed": int} -> {"audio": base64 of 16-bit LE PCM, "sample_rate": int}.
Readiness: GET /health (200 once the worker has loaded the pipeline).
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

import litserve as ls

from cosyvoice_server.audio import to_int16
from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.engine.pipeline import Pipeline

from .static_batch import synthesize_batch


class TTSAPI(ls.LitAPI):
    def __init__(self, model_dir: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_dir = model_dir

    def setup(self, device: str) -> None:
        self.pipeline = Pipeline(self.model_dir, "cpu")
        self.sample_rate = self.pipeline.manifest.sample_rate

    def decode_request(self, request: dict, **kwargs: Any) -> tuple[str, int]:
        return str(request["input"]), int(request.get("seed", 0))

    def batch(self, inputs: list[tuple[str, int]]) -> list[tuple[str, int]]:
        return inputs

    def predict(self, x: list[tuple[str, int]], **kwargs: Any) -> list[bytes]:
        return [to_int16(w).tobytes() for w in synthesize_batch(self.pipeline, x)]

    def unbatch(self, output: list[bytes]) -> list[bytes]:
        return output

    def encode_response(self, output: bytes, **kwargs: Any) -> dict:
        return {"audio": base64.b64encode(output).decode("ascii"), "sample_rate": self.sample_rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--batch-timeout-ms", type=float, default=5.0)
    ap.add_argument("--model-dir", type=Path, default=BUNDLED_MODEL)
    args = ap.parse_args()
    api = TTSAPI(args.model_dir, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout_ms / 1000)
    # timeout=False: queued requests wait as long as the harness does (our server runs with a 600 s timeout).
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=False)
    server.run(host=args.host, port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
