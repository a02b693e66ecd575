# warmfleet — two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck imports unit bench-routing sim clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $@

demo: $(STAMP)
	$(BIN)/warmfleet demo

lint: $(DEV_STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

imports: $(DEV_STAMP)
	$(BIN)/lint-imports

unit: $(DEV_STAMP)
	$(BIN)/pytest -q

test: lint typecheck imports unit

bench-routing: $(STAMP)
	$(BIN)/python -m warmfleet.bench.routing_bench --out bench-results/routing.json

clean:
	rm -rf $(VENV) bench-results warmfleet-report .mypy_cache .ruff_cache .pytest_cache
