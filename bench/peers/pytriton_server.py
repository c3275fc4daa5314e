"""The request-level batch pipeline hosted in PyTriton (Triton's dynamic batcher), for side-by-side comparison.

    .bench-venvs/pytriton/bin/python -m bench.peers.pytriton_server \
        --port 8200 --max-batch-size 16 --max-queue-delay-ms 5

Model `tts` over Triton's KServe-v2 HTTP protocol: inputs `text` (BYTES [1]) and `seed` (INT64 [1]);
outputs `audio` (INT16 [-1], 24 kHz PCM, zero-padded to the longest in its batch) and `length` (INT64 [1],
samples that are real). Readiness: GET /v2/models/tts/ready.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sysconfig
import tempfile
import uuid
from pathlib import Path

import numpy as np

from .launch import remove_new_scratch, scratch_snapshot

MODEL = "tts"


def _fix_stub_libpython() -> None:
    """Triton's Python backend stub links the system libpython3.11 but loads this interpreter's standard
    library; when the two differ (pyenv, a venv over another build) model load fails with
    `'_thread.RLock' object has no attribute '_recursion_count'`. Our own libpython first fixes it."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if libdir and (not paths or paths[0] != libdir):
        os.environ["LD_LIBRARY_PATH"] = ":".join([libdir, *paths])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--max-queue-delay-ms", type=float, default=5.0)
    ap.add_argument("--model-dir", type=Path, default=None)
    args = ap.parse_args()
    _fix_stub_libpython()

    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    from cosyvoice_server.audio import to_int16
    from cosyvoice_server.config import BUNDLED_MODEL
    from cosyvoice_server.engine.pipeline import Pipeline

    from .static_batch import synthesize_batch

    pipeline = Pipeline(args.model_dir or BUNDLED_MODEL, "cpu")

    @batch
    def infer(text: np.ndarray, seed: np.ndarray) -> dict[str, np.ndarray]:
        reqs = [(t[0].decode("utf-8"), int(s[0])) for t, s in zip(text, seed)]
        wavs = [to_int16(w) for w in synthesize_batch(pipeline, reqs)]
        lengths = np.array([[len(w)] for w in wavs], np.int64)
        audio = np.zeros((len(wavs), max(1, int(lengths.max()))), np.int16)
        for i, w in enumerate(wavs):
            audio[i, : len(w)] = w
        return {"audio": audio, "length": lengths}

    # PyTriton refuses an existing workspace directory: name a fresh one and let it create it.
    workspace = Path(tempfile.gettempdir()) / f"pytriton-ws-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    before = scratch_snapshot()
    config = TritonConfig(http_address=args.host, http_port=args.port, allow_grpc=False, allow_metrics=False,
                          log_verbose=0, exit_on_error=True)
    batcher = DynamicBatcher(max_queue_delay_microseconds=int(args.max_queue_delay_ms * 1000))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl+C: Triton cleans up
    try:
        with Triton(config=config, workspace=workspace) as triton:
            triton.bind(
                model_name=MODEL,
                infer_func=infer,
                inputs=[Tensor(name="text", dtype=bytes, shape=(1,)), Tensor(name="seed", dtype=np.int64, shape=(1,))],
                outputs=[Tensor(name="audio", dtype=np.int16, shape=(-1,)),
                         Tensor(name="length", dtype=np.int64, shape=(1,))],
                config=ModelConfig(max_batch_size=args.max_batch_size, batcher=batcher),
                strict=True,
            )
            triton.serve()
    except KeyboardInterrupt:
        pass
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        remove_new_scratch(before)


if __name__ == "__main__":
    main()
