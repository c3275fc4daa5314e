"""Start-up time of a replica, per phase: the fetch step as the pod runs it (download of the model archive
from a local HTTP server, unpacking, the node cache's check or fill), then `cosyvoice-server serve` to
/healthz and /readyz (sessions per stage, text workers, warm-up, from the server's own
`cosyvoice_startup_phase_seconds`), then the first request.

    # the tiny model, server phases only (no fetch step)
    .venv/bin/python -m bench.startup --runs 5
    # real size (CosyVoice2-0.5B's layer sizes, 1.9 GB): build it once, outside the repository
    .venv/bin/python -m cosyvoice_server.convert.miniature --out /tmp/ckpt --size full
    .venv/bin/cosyvoice-server convert --checkpoint /tmp/ckpt --out /tmp/model-full
    .venv/bin/python -m bench.startup --model-dir /tmp/model-full --fetch --runs 3 --out docs/bench/startup.json
    .venv/bin/python -m bench.startup --model-dir /tmp/model-full --fetch --runs 3 --bandwidth-mib-s 100 \
        --out docs/bench/startup.json

With `--fetch` three starts are compared: `before` (a fetch into an empty model volume: what every pod does
without the node cache), `miss` (the first pod on a node: the cache filled) and `hit` (a later pod: the cache
entry checked and used). `--bandwidth-mib-s`
paces the HTTP server, for a download at a link's speed instead of the loopback's. The time to ready is
the fetch step plus the server's start; the image pull and the scheduling of the pod come on top.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.startup import parse_lines

from .run import Server

SCENARIOS = {"before": False, "miss": True, "hit": True}  # name: the node cache used
FIRST_TEXT = "The first request after start-up."


class ArchiveServer:
    """Serves one file at /model.tar on 127.0.0.1, at most `rate` bytes/s when given."""

    def __init__(self, archive: Path, rate: float | None) -> None:
        size = archive.stat().st_size

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                t0, sent = time.monotonic(), 0
                with archive.open("rb") as f:
                    while block := f.read(1 << 20):
                        self.wfile.write(block)
                        sent += len(block)
                        if rate:  # paced: never ahead of rate * elapsed
                            time.sleep(max(0.0, sent / rate - (time.monotonic() - t0)))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/model.tar"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def archive_of(model_dir: Path, work: Path) -> tuple[Path, str]:
    """An uncompressed tar of the model (gzip's decompression, on one core, would add to the unpack phase)."""
    archive = work / f"{model_dir.name}.tar"
    if not archive.exists():
        with tarfile.open(archive.with_suffix(".partial"), "w", dereference=True) as tf:
            tf.add(model_dir, arcname=model_dir.name)
        archive.with_suffix(".partial").rename(archive)
    h = hashlib.sha256()
    with archive.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return archive, h.hexdigest()


def fetch_step(url: str, digest: str, dest: Path | None, cache: Path | None) -> tuple[Path, float, dict[str, float]]:
    """Runs `cosyvoice-server fetch` as the init container does; (model dir, seconds, its phases)."""
    where = ["--cache-dir", str(cache)] if cache else ["--dest", str(dest)]
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "cosyvoice_server.cli", "fetch", "--uri", url, "--sha256", digest,
                        *where], capture_output=True, text=True)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"fetch failed: {r.stderr.strip()}")
    return Path(r.stdout.strip().splitlines()[-1]), took, parse_lines(r.stdout)


def server_phases(metrics_text: str) -> dict[str, float]:
    return {s.labels["phase"]: s.value for fam in text_string_to_metric_families(metrics_text)
            if fam.name == "cosyvoice_startup_phase_seconds" for s in fam.samples}


def request_seconds(client: httpx.Client) -> float:
    t0 = time.monotonic()
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "input": FIRST_TEXT, "response_format": "pcm",
                                              "seed": 0}, timeout=600)
    r.raise_for_status()
    return time.monotonic() - t0


def one_start(model_dir: Path, device: str, args: list[str]) -> dict:
    """Seconds to /healthz, to /readyz and of the first request after it, and the server's phases."""
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
                        ready = time.monotonic() - t0
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)  # polling faster would take CPU from the start-up it measures
            else:
                raise RuntimeError(f"the server exited with {server.proc.returncode} during start-up")
            # the same request twice: what the first pays beyond the second is lazy set-up the warm-up left
            first, second = (request_seconds(client) for _ in range(2))
            phases = server_phases(client.get("/metrics").text)
        return {"healthz_s": up if up is not None else ready, "ready_s": ready, "first_request_s": first,
                "second_request_s": second, "phases": phases}
    finally:
        server.stop()


def scenario_start(name: str, url: str, digest: str, work: Path, device: str, extra: list[str]) -> dict:
    cached = SCENARIOS[name]
    cache = work / "node-cache"
    dest = work / "model-volume"
    shutil.rmtree(dest, ignore_errors=True)
    if name == "miss":
        shutil.rmtree(cache, ignore_errors=True)
    model, fetch_s, fetch_phases = fetch_step(url, digest, None if cached else dest, cache if cached else None)
    start = one_start(model, device, extra)
    return {"fetch_s": fetch_s, **start, "phases": fetch_phases | start["phases"],
            "total_to_ready_s": fetch_s + start["ready_s"]}


def median_of(runs: list[dict]) -> dict:
    keys = ("fetch_s", "healthz_s", "ready_s", "first_request_s", "second_request_s", "total_to_ready_s")
    out = {k: round(statistics.median(r[k] for r in runs), 2) for k in keys if k in runs[0]}
    out["total_range_s"] = [round(min(r["total_to_ready_s"] for r in runs), 2),
                            round(max(r["total_to_ready_s"] for r in runs), 2)] if "total_to_ready_s" in runs[0] else None
    phases = sorted({p for r in runs for p in r["phases"]})
    out["phases"] = {p: round(statistics.median(r["phases"][p] for r in runs if p in r["phases"]), 2) for p in phases}
    return out


def model_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model-dir", type=Path, default=BUNDLED_MODEL)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fetch", action="store_true", help="include the fetch step: before, cache miss, cache hit")
    ap.add_argument("--bandwidth-mib-s", type=float, help="pace the archive's download (MiB/s)")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/cosyvoice-startup"),
                    help="the archive, the model volume and the node cache (needs twice the model's size)")
    ap.add_argument("--out", type=Path, help="write the medians as JSON (docs/bench/startup.json)")
    ap.add_argument("server_args", nargs="*", help="more `serve` flags, after --")
    a = ap.parse_args()
    load_before = round(os.getloadavg()[0], 1)
    result: dict = {"command": ".venv/bin/python -m bench.startup " + " ".join(sys.argv[1:]),
                    "date": time.strftime("%Y-%m-%d"), "machine": machine(),
                    "model": {"dir": a.model_dir.name, "bytes": model_bytes(a.model_dir)},
                    "device": a.device, "runs": a.runs, "bandwidth_mib_s": a.bandwidth_mib_s}
    if not a.fetch:
        runs = [one_start(a.model_dir, a.device, a.server_args) for _ in range(a.runs)]
        result["scenarios"] = {"serve": median_of(runs)}
    else:
        a.work_dir.mkdir(parents=True, exist_ok=True)
        archive, digest = archive_of(a.model_dir, a.work_dir)
        result["model"]["archive_bytes"] = archive.stat().st_size
        http = ArchiveServer(archive, a.bandwidth_mib_s * 2**20 if a.bandwidth_mib_s else None)
        try:
            runs: dict[str, list[dict]] = {name: [] for name in SCENARIOS}
            for _ in range(a.runs):  # interleaved, so drift on a shared machine touches all three alike
                for name in SCENARIOS:
                    runs[name].append(scenario_start(name, http.url, digest, a.work_dir, a.device, a.server_args))
        finally:
            http.close()
            shutil.rmtree(a.work_dir / "model-volume", ignore_errors=True)
            shutil.rmtree(a.work_dir / "node-cache", ignore_errors=True)
        result["scenarios"] = {name: median_of(r) for name, r in runs.items()}
        s = result["scenarios"]
        result["cold_start_s"] = {"miss": s["miss"]["total_to_ready_s"], "hit": s["hit"]["total_to_ready_s"],
                                  "before": s["before"]["total_to_ready_s"]}
        result["hit_over_miss"] = round(s["hit"]["total_to_ready_s"] / s["miss"]["total_to_ready_s"], 3)
    result["load_avg_1m"] = [load_before, round(os.getloadavg()[0], 1)]  # a shared machine: how busy it was
    print(json.dumps(result, indent=1))
    if a.out:
        if not a.fetch:
            raise SystemExit("--out records the fetch comparison: add --fetch")
        old = json.loads(a.out.read_text()) if a.out.exists() else {}
        a.out.write_text(json.dumps(merged(old, result), indent=1) + "\n")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    return f"{os.cpu_count()} × {cpu}, Python {platform.python_version()}"


def merged(old: dict, new: dict) -> dict:
    """The results file: one measurement per download speed (a new one replaces the old at its speed), and
    the cold start the autoscaling simulator reads: the paced measurement's when there is one (a pod
    downloads over a network, not the loopback), else the loopback's."""
    keep = [m for m in old.get("measurements", []) if m["bandwidth_mib_s"] != new["bandwidth_mib_s"]]
    measurements = sorted(keep + [new], key=lambda m: m["bandwidth_mib_s"] or float("inf"))
    source = next((m for m in measurements if m["bandwidth_mib_s"]), measurements[0])
    return {"cold_start_s": {k: source["cold_start_s"][k] for k in ("miss", "hit")},
            "cold_start_note": "seconds from the fetch step's start to /readyz at real size on "
                               f"{source['machine']}, the download "
                               + (f"paced to {source['bandwidth_mib_s']:g} MiB/s" if source["bandwidth_mib_s"]
                                  else "over the loopback") + "; the image pull and the pod's scheduling come on top",
            "measurements": measurements}


if __name__ == "__main__":
    main()
