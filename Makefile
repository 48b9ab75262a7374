# ascendkit front door: `make help` lists every target.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
HW     ?= a3
STACK  ?=
RENDERED := Dockerfile.a2 Dockerfile.a3 $(wildcard dockerfiles/*/Dockerfile.*)

.DEFAULT_GOAL := help
.PHONY: help install render check lint unit test bench clean

help: ## List every target with one line each
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP) ## Create .venv and install ascendkit with its dev tools (pytest, ruff, mypy, hadolint)

render: $(STAMP) ## Validate the matrix and write every generated file (Dockerfiles, schema, README tables)
	$(BIN)/ascendkit matrix validate
	$(BIN)/ascendkit render --all
	@echo "Dockerfile for HW=$(HW)$(if $(STACK), STACK=$(STACK)): $(BIN)/ascendkit render --hw $(HW)$(if $(STACK), --stack $(STACK))"

check: $(STAMP) ## Fail if a generated file differs from what the matrix and templates produce
	$(BIN)/ascendkit render --check

lint: $(STAMP) ## ruff, mypy --strict, hadolint on every rendered Dockerfile, render --check
	$(BIN)/ruff check buildkit tests benchmarks
	$(BIN)/ruff format --check buildkit tests benchmarks
	$(BIN)/mypy
	$(BIN)/hadolint --config .hadolint.yaml $(RENDERED)
	$(BIN)/ascendkit matrix validate
	$(BIN)/ascendkit render --check

unit: $(STAMP) ## Run the test suite
	$(BIN)/pytest

test: lint unit ## Lint and run every test (what CI runs)

bench: $(STAMP) ## Print timings of `ascendkit --help` and `render --all --check`
	$(BIN)/python benchmarks/bench_cli.py

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
