# The two commands that matter: `make convert` (the main job) and `make test`.
# Each creates .venv with everything it needs on first use (idempotent afterwards).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RECIPE ?= recipes/deeplabv3plus.yaml
PYTEST_ARGS ?=

.PHONY: venv convert lint test test-slow zoo bench clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

convert: venv
	$(BIN)/torch2ms convert --recipe $(RECIPE)

lint: venv
	$(BIN)/ruff check torch2ms tests benchmarks
	$(BIN)/ruff format --check torch2ms tests benchmarks

test: venv lint
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: venv
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

zoo: venv
	$(BIN)/torch2ms zoo recipes/zoo/torchvision.yaml --jobs 2

bench: venv
	$(BIN)/torch2ms bench --recipe $(RECIPE)

clean:
	rm -rf runs dist .pytest_cache
