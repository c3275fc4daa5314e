"""`make demo`: start the server on the CPU with the bundled model, synthesize one sentence over the
HTTP API as a streamed WAV, and report the file, its duration and the time to first audio."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import soundfile as sf

TEXT = "Hello! This is CosyVoice serving speech on Kubernetes, one streamed chunk at a time."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="demo-output/hello.wav")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--model-dir", help="the model to serve (default: the bundled CosyVoice2 model)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = os.environ | {"COSYVOICE_LOG_LEVEL": "warning"}
    server = subprocess.Popen([sys.executable, "-m", "cosyvoice_server.cli", "serve", "--device", "cpu",
                               "--host", "127.0.0.1", "--port", str(port),
                               *(["--model-dir", args.model_dir] if args.model_dir else [])], env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                print(f"error: the server exited with code {server.returncode}", file=sys.stderr)
                return 1
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                print("error: the server did not become ready in 120 s", file=sys.stderr)
                return 1
            time.sleep(0.1)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        body = {"model": "tts-1", "input": args.text, "response_format": "wav", "stream": True}
        t0 = time.monotonic()
        ttfa = None
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as r, out.open("wb") as f:
            if r.status_code != 200:
                print(f"error: {r.status_code} {r.read().decode()}", file=sys.stderr)
                return 1
            received = 0
            for part in r.iter_raw():
                received += len(part)
                if ttfa is None and received > 44:  # past the WAV header: audio samples
                    ttfa = time.monotonic() - t0
                f.write(part)
        total = time.monotonic() - t0
        audio, sr = sf.read(out)  # streamed WAV sizes are placeholders; libsndfile reads to the end
        sf.write(out, audio, sr, subtype="PCM_16")  # rewrite with exact sizes for every player
        duration = len(audio) / sr
        print(f"wrote {out.resolve()}")
        print(f"duration {duration:.2f} s at {sr} Hz; time to first audio {ttfa * 1000:.0f} ms; "
              f"total {total * 1000:.0f} ms (real-time factor {total / duration:.3f})")
        print("note: the bundled tiny model has random weights, so it sounds like noise; see README 'Model repository'.")
        return 0
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
