# The interface to working on keel: `make install`, `make run`, `make test`, `make lint`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := shared services deploy bench tests

.DEFAULT_GOAL := all

.PHONY: install
install: $(STAMP) ## create .venv and install keel with its dev tools (again when pyproject.toml changes)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Lint and test need a virtualenv, but do not reinstall an existing one: `make install` does.
$(BIN)/python:
	$(MAKE) install

.PHONY: fmt
fmt: $(BIN)/python ## format the code and apply safe lint fixes
	$(BIN)/ruff format $(SOURCES)
	$(BIN)/ruff check --fix $(SOURCES)

.PHONY: lint
lint: $(BIN)/python ## ruff (lint and format check) and mypy
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy shared services deploy bench

.PHONY: typecheck
typecheck: $(BIN)/python ## mypy --strict over shared, services, deploy and bench
	$(BIN)/mypy shared services deploy bench

.PHONY: test
test: $(BIN)/python ## the whole suite: unit, functional and end-to-end
	$(BIN)/pytest

.PHONY: test-unit
test-unit: $(BIN)/python ## unit tests only (no PostgreSQL or RabbitMQ needed)
	$(BIN)/pytest tests/unit

.PHONY: test-functional
test-functional: $(BIN)/python ## functional tests (real PostgreSQL and RabbitMQ)
	$(BIN)/pytest tests/functional

.PHONY: test-e2e
test-e2e: $(BIN)/python ## end-to-end tests (real processes, real openstack CLI)
	$(BIN)/pytest tests/e2e

.PHONY: run
run: install ## run a local cloud in the foreground; Ctrl-C stops it
	$(BIN)/python deploy/localcloud.py

.PHONY: clean
clean: $(BIN)/python ## drop the local cloud's database and .keel/ (refused while it runs)
	$(BIN)/python deploy/localcloud.py clean

.PHONY: bench
bench: $(BIN)/python ## run the benchmarks in bench/
	@found=0; for script in bench/*.py; do \
		[ -e "$$script" ] || continue; found=1; \
		echo "== $$script"; $(BIN)/python "$$script" || exit 1; \
	done; [ $$found = 1 ] || echo "no benchmarks in bench/ yet"

.PHONY: all
all: lint test ## lint, then test

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | sort
