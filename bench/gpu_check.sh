#!/usr/bin/env bash
# GPU check for a machine with one NVIDIA GPU that starts bare and reaches no network.
#   bench/gpu_check.sh RESULTS_DIR [MODEL_DIR]
# MODEL_DIR: a model directory to benchmark, of either family, e.g. one written by `cosyvoice-server convert`
# from Fun-CosyVoice3-0.5B or CosyVoice2-0.5B (default: a random-weight model at CosyVoice2's sizes, built on first
# use). CosyVoice3's vocoder computes its f0 and source phase in float64, which the CUDA provider may leave to
# the CPU: the log's session lines say where each node ran.
# Needs, in .whl/ (prepared beforehand with `pip download --no-deps --only-binary=:all:` for that
# machine's Python): onnxruntime-gpu and whatever of the server's dependencies the machine lacks
# (see docs/benchmarks.md "GPU runs"). Runs the GPU-marked tests, then the full-size benchmark.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh RESULTS_DIR [MODEL_DIR]}
model_args=()
if [ -n "${2:-}" ]; then
  [ -f "$2/model.yaml" ] || { echo "error: $2/model.yaml: missing (not a model directory)" >&2; exit 2; }
  model_args=(--model-dir "$(cd "$2" && pwd)")
fi
mkdir -p "$out"
cd "$(dirname "$0")/.."
exec > >(tee "$out/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
site=/tmp/cosyvoice-site
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || exit 1
fi
# The project runs from its source tree: nothing to build.
export PYTHONPATH="$site:$PWD/inference_image:$PWD"
nvidia-smi --query-gpu=name,memory.total,driver_version,mig.mode.current --format=csv || true
python3 -m cosyvoice_server.cli doctor | tee "$out/doctor.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu --junitxml="$out/gpu_tests.xml"
tests_rc=$?
timeout 330 python3 -m bench.gpu --out "$out" "${model_args[@]}" --duration 6 --batch-sizes 1,16 --ttfa-concurrency 1,4,16
bench_rc=$?
if [ -n "${2:-}" ] && grep -q "incremental:" "$2/model.yaml"; then  # a converted model: streamed flow, re-run vs new frames only
  timeout 240 python3 -m bench.flow_streaming "${model_args[@]}" --device cuda --seconds 3.5 10 --rounds 1 --out "$out/flow_streaming.json"
fi
echo "gpu tests exit $tests_rc, benchmark exit $bench_rc"
exit $(( tests_rc || bench_rc ))
