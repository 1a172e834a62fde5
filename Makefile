# fedexp — federated-learning experiment runner. `make` lists the targets.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CLAIMS_JOBS ?= 2
export WANDB_SILENT := true
# bytecode caches are written (into the ignored __pycache__ dirs): without them every test worker
# and every CLI run compiles fedexp and rewrites the test modules again
unexport PYTHONDONTWRITEBYTECODE

.DEFAULT_GOAL := help
.PHONY: help install run test test-fast test-full smoke bench claims claims-paper lint format clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[dev]'
	# bytecode of the environment, written once: pip writes none where PYTHONDONTWRITEBYTECODE is
	# set, and each process then compiles the torch modules it imports again (about 9 s a run)
	$(BIN)/python -m compileall -q -j 0 -x 'py312_' $(VENV)/lib > /dev/null
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install fedexp with its dev tools

run: install  ## run the default experiment (FedAvg on the embedded digits data)
	$(BIN)/python -m fedexp

test: install  ## the fast test suite (unit, algorithm checks, smoke runs), on 2 workers
	WANDB_MODE=offline $(BIN)/python -m pytest -n 2 --dist worksteal

test-fast: install  ## the edit-test loop: no process started, no whole experiment (~2 min)
	WANDB_MODE=offline $(BIN)/python -m pytest -n 2 --dist worksteal -m "not slow and not cli and not experiment"

test-full: install  ## every test, slow ones included
	WANDB_MODE=offline $(BIN)/python -m pytest -n 2 -m ''

smoke: install  ## tiny end-to-end runs through the CLI only
	WANDB_MODE=offline $(BIN)/python -m pytest tests/cli

bench: install  ## fedexp vs a plain PyTorch loop on a fixed FedAvg workload
	$(BIN)/python scripts/bench.py

claims: install  ## the papers' claims on small data, 5 seeds (~37 min on 2 cores); rewrites docs/CLAIMS.md's table
	OMP_NUM_THREADS=1 $(BIN)/python -m fedexp.claims --jobs $(CLAIMS_JOBS) --update-doc docs/CLAIMS.md

claims-paper: install  ## the claims at the papers' protocols on MNIST-1D, 3 seeds (~110 min); rewrites its table
	OMP_NUM_THREADS=1 $(BIN)/python -m fedexp.claims --tier paper --jobs $(CLAIMS_JOBS) --update-doc docs/CLAIMS.md

lint: install  ## ruff lint and format check; the package's import layers (import-linter)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports --no-cache

format: install  ## ruff fix and format
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

clean:  ## remove outputs and caches (keeps .venv)
	rm -rf outputs multirun wandb .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
