# The two commands that matter: `make convert` (the main job) and `make test`.
# Each creates .venv with everything it needs on first use (idempotent afterwards).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV = $(BIN)/uv pip install -q --python $(BIN)/python
RECIPE ?= recipes/deeplabv3plus.yaml
ZOO ?= recipes/zoo/torchvision.yaml
ZOO_STAMP := $(VENV)/.installed-zoo
PYTEST_ARGS ?=
# Two pytest-xdist workers: the CPU count here, and what fits in memory beside MindSpore (~5 GB peak each).
# --dist loadfile keeps a file's tests (and its module fixtures) on one worker, in the order tests/conftest.py
# gives (long files first; --no-loadscope-reorder keeps it). The converters' coverage check takes the union
# of what the workers ran (tests/conftest.py).
TEST_WORKERS ?= 2
# make's commands run as Python does by default, writing a module's .pyc where none is: an environment
# with PYTHONDONTWRITEBYTECODE=1 (the development machines') hid that importing network.py wrote a __pycache__ into
# stage folders, which their records hashed (4c58898).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv convert lint test test-slow test-avx2 zoo bench conformance clean

# uv installs what pip would (the same versions, from the same registry) in a third of the time: from a
# fresh clone 53 s against 155 s with both caches empty (benchmarks/results/make_test.md). Not with uv's
# --compile-bytecode, which compiles every module of the 9 GB environment (57 s here): .ci/warm_imports.py
# imports what torch2ms and the suite use once, in one process, so those .pyc files exist before two
# pytest workers would both compile torch and MindSpore at once.
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(BIN)/pip install -q --disable-pip-version-check uv==0.13.9
	$(UV) -r requirements.txt
	$(UV) --no-deps -r requirements-nodeps.txt
	$(UV) --no-deps -e .
	$(BIN)/python .ci/warm_imports.py
	touch $(STAMP)

venv: $(STAMP)

convert: venv
	$(BIN)/torch2ms convert --recipe $(RECIPE)

lint: venv
	$(BIN)/ruff check torch2ms tests benchmarks
	$(BIN)/ruff format --check torch2ms tests benchmarks

test: venv lint
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-slow: venv
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

# The CPU-dependent tests on an emulated AVX2-only EPYC (qemu-user; ~25 min): .ci/avx2
test-avx2: venv
	.ci/avx2

# The zoo extras (timm, segmentation-models-pytorch, ultralytics: pyproject's [zoo]) go into .venv first.
$(ZOO_STAMP): $(STAMP) pyproject.toml
	$(UV) -e '.[zoo]'
	touch $(ZOO_STAMP)

zoo: $(ZOO_STAMP)
	$(BIN)/torch2ms zoo $(ZOO) --jobs 2

bench: venv
	$(BIN)/torch2ms bench --recipe $(RECIPE)

# ONNX's backend node cases through the conversion (all 1884, a few minutes): rewrites docs/conformance.md.
conformance: venv
	cd tests && ../$(BIN)/python -m conformance.harness --write ../docs/conformance.md

clean:
	rm -rf runs dist .pytest_cache
