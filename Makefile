# ascendkit front door: `make help` lists every target.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
HW     ?= a3
STACK  ?=
ARCH   ?=
RENDERED := Dockerfile.a2 Dockerfile.a3 $(wildcard dockerfiles/*/Dockerfile.*)
SERVICES_DIR ?= /tmp/ascendkit-services
SERVICES_ENV := $(SERVICES_DIR)/env
# ASCENDKIT_ARM64=1 also makes the arm64 stand-in (qemu) and runs the slow arm64 build test.
ARM64_FLAG := $(if $(filter 1,$(ASCENDKIT_ARM64)),--arm64)
export ASCENDKIT_SERVICES_DIR := $(SERVICES_DIR)

.DEFAULT_GOAL := help
.PHONY: help install render check build lint unit services services-stop test bench clean

help: ## List every target with one line each
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

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

build: $(STAMP) ## Build, verify and tag the image for HW (and STACK, ARCH) on the official CANN base
	$(BIN)/ascendkit matrix validate
	$(BIN)/ascendkit build --hw $(HW)$(if $(STACK), --stack $(STACK))$(if $(ARCH), --arch $(ARCH))

lint: $(STAMP) ## ruff, mypy --strict, hadolint on every rendered Dockerfile, render --check
	$(BIN)/ruff check buildkit tests benchmarks
	$(BIN)/ruff format --check buildkit tests benchmarks
	$(BIN)/mypy
	$(BIN)/hadolint --config .hadolint.yaml $(RENDERED)
	$(BIN)/ascendkit matrix validate
	$(BIN)/ascendkit render --check

unit: $(STAMP) ## Run the tests that need no Docker engine
	$(BIN)/pytest -m "not docker"

services: $(STAMP) ## As root: start dockerd, the registry on 127.0.0.1:5000 and the stand-in CANN base
	$(BIN)/python -m tests.services start $(ARM64_FLAG)
	@echo "now: set -a; . $(SERVICES_ENV); set +a"

services-stop: $(STAMP) ## Stop what `make services` started
	$(BIN)/python -m tests.services stop

test: lint ## Lint, start the engine/registry/stand-in, run every test, stop them again (what CI runs)
	$(BIN)/python -m tests.services start $(ARM64_FLAG)
	set -a; . $(SERVICES_ENV); set +a; ASCENDKIT_REQUIRE_DOCKER=1 $(BIN)/pytest; status=$$?; \
	  $(BIN)/python -m tests.services stop; exit $$status

bench: $(STAMP) ## CLI timings; with `make services` running, build timings, size and wasted bytes too
	$(BIN)/python benchmarks/bench_cli.py
	$(BIN)/python benchmarks/bench_verify.py
	@if [ -f $(SERVICES_ENV) ]; then set -a; . $(SERVICES_ENV); set +a; $(BIN)/python benchmarks/bench_build.py; \
	  else echo "bench_build: skipped (run \`make services\` first for build benchmarks)"; fi

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
