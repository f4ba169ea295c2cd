# Set-up is part of each target: a fresh machine needs only `make example` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch, pinned: an unpinned torch pulls a multi-GB CUDA build. Triton is
# pinned to the version the GPU hosts run, so the interpreter checks the same compiler.
TORCH_PIN := torch==2.13.0 triton==3.6.0

.PHONY: example test lint

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_PIN)
	$(BIN)/pip install --quiet -e ".[dev,hf,ray]" $(TORCH_PIN)
	touch $@

# Bounded so that a machine without a GPU (Triton under its interpreter) finishes in minutes.
example: $(BIN)/.installed
	$(BIN)/python -m core.optimize examples/mlp_block.py --max-candidates 12 --budget 5

# Two workers, each test file whole on one of them (its module fixtures start their worker
# processes once); the suite's times with and without are in bench/NOTES.md.
test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

lint: $(BIN)/.installed
	$(BIN)/ruff check .
