"""cosyvoice-server against upstream's own CosyVoice3 code on a checkpoint made for the run: its audio over HTTP,
whole and streamed, for every voice and sentence.

    .venv/bin/python -m bench.vs_upstream.parity3 --upstream ~/src/CosyVoice [--seed 23] [--work-dir DIR]

A random-weight CosyVoice3 checkpoint in upstream's layout (convert/miniature.py; other layer sizes than the test
suite's, three voices, the seed given) is decoded greedily (its yaml's sampling set to top_k 1, as the golden
data's), converted, and served twice: `cosyvoice-server serve` and upstream3_server.py (upstream's
CosyVoice3Model from the checkout). Printed per request: both lengths in samples, the largest sample difference
and the log-mel distance (the golden README's budget for a correct server: 0.002).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

from cosyvoice_server.convert import miniature
from cosyvoice_server.convert.convert import convert
from cosyvoice_server.voices import spectral

from ..run import free_port
from .__main__ import REPO, Served

SIZE = dataclasses.replace(miniature.MINI3, qwen_hidden=96, qwen_heads=6, qwen_kv_heads=3, qwen_mlp=160, dit_dim=96,
                           dit_depth=3, dit_heads=3, dit_head_dim=32, lookahead_channels=48, hift_channels=32,
                           hift_res_kernels=(3, 5), f0_channels=48, speakers=("ann", "bob", "cy"))
TEXTS = ("A sentence the suite never saw, spoken by another voice.", "Short one.",
         "Numbers like forty two and a comma, then more words to stream in chunks for a while longer.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", type=Path, required=True, help="a checkout of FunAudioLLM/CosyVoice")
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--work-dir", type=Path)
    args = ap.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="cosyvoice3-parity-"))
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    shutil.rmtree(work / "model", ignore_errors=True)
    ckpt = miniature.build_cosyvoice3(work / "ckpt", SIZE, seed=args.seed)
    yaml = ckpt / "cosyvoice3.yaml"
    yaml.write_text(yaml.read_text().replace("top_k: 25", "top_k: 1").replace("tau_r: 0.1", "tau_r: 2.0"))
    model = convert(ckpt, work / "model", ["fp32"])
    py = sys.executable
    ports = free_port(), free_port()
    systems = [Served("upstream", [py, "-m", "bench.vs_upstream.upstream3_server", "--upstream", str(args.upstream),
                                   "--checkpoint", str(ckpt), "--model-dir", str(model), "--port", str(ports[0]),
                                   "--threads", "1"], ports[0], work / "upstream.log"),
               Served("server", [py, "-m", "cosyvoice_server.cli", "serve", "--model-dir", str(model), "--device", "cpu",
                                 "--host", "127.0.0.1", "--port", str(ports[1])], ports[1], work / "server.log")]
    worst = 0.0
    try:
        for s in systems:
            s.wait()
        for voice in SIZE.speakers:
            for text in TEXTS:
                for stream in (False, True):
                    body = {"model": "tts-1", "input": text, "voice": voice, "stream": stream, "response_format": "pcm"}
                    a, b = (np.frombuffer(httpx.post(s.url + "/v1/audio/speech", json=body, timeout=600).content, "<i2")
                            .astype(np.float32) / 32768 for s in systems)
                    n = min(len(a), len(b))
                    dist = float(np.abs(spectral.prompt_mel(a[:n]) - spectral.prompt_mel(b[:n])).mean())
                    worst = max(worst, dist if len(a) == len(b) else float("inf"))
                    print(f"{voice} stream={stream}: {len(b)} / {len(a)} samples (server / upstream), max abs "
                          f"{float(np.abs(a[:n] - b[:n]).max()):.1e}, log-mel L1 {dist:.1e}", flush=True)
    finally:
        for s in systems:
            s.stop()
    print(f"worst log-mel L1 {worst:.1e} (work dir {work}; repository {REPO})")
    return 0 if worst < 0.002 else 1


if __name__ == "__main__":
    raise SystemExit(main())
