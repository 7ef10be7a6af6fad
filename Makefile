# Set-up is automatic: every target creates .venv and installs the project on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: test lint demo bench proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check hami_plugin tests proto
	$(BIN)/ruff format --check hami_plugin tests proto
	$(BIN)/mypy --strict hami_plugin
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest

demo: $(STAMP)
	$(BIN)/hami --help

bench: $(STAMP)
	@set -e; for bench in tests/benchmarks/bench_*.py; do \
		echo "== $$bench"; $(BIN)/python $$bench; done

proto: $(STAMP)
	$(BIN)/python proto/generate.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis *.egg-info
