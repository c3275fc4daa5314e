# Two commands set everything up on a fresh Debian machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DEMO_OUT ?= demo-output
PYTEST_ARGS ?=

.PHONY: demo test install install-test system-deps serve doctor tiny-model bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(VENV)/bin/python inference_image/pyproject.toml operator/pyproject.toml
	$(PIP) install -q -e ./inference_image -e ./operator
	touch $@

install: $(STAMP)

$(TEST_STAMP): $(STAMP) requirements-test.txt
	$(PIP) install -q -r requirements-test.txt
	touch $@

# Debian packages the integration tests run for real (Prometheus and promtool).
system-deps:
	@if ! command -v prometheus >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; \
		else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; fi; \
	fi

install-test: $(TEST_STAMP) system-deps

# Starts the server on CPU with the bundled tiny model, synthesizes one sentence over HTTP, writes a WAV.
demo: install
	$(PY) -m cosyvoice_server.demo --out $(DEMO_OUT)/hello.wav

test: install-test
	$(PY) -m pytest $(PYTEST_ARGS)

serve: install
	$(VENV)/bin/cosyvoice-server serve --device cpu

doctor: install
	$(VENV)/bin/cosyvoice-server doctor

# Regenerates the committed tiny model (deterministic: the same bytes every time).
tiny-model: install
	$(VENV)/bin/cosyvoice-server generate-model --preset tiny --out inference_image/cosyvoice_server/models/tiny

bench: install-test
	bash bench/peers/setup.sh
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache
