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
# ASCENDKIT_ARM64=1 also makes the arm64 stand-in (qemu) and runs the emulated tests on an engine of their own.
ARM64_FLAG := $(if $(filter 1,$(ASCENDKIT_ARM64)),--arm64)
export ASCENDKIT_SERVICES_DIR := $(SERVICES_DIR)

.DEFAULT_GOAL := help
JOB    ?= grpo
SMOKE_OUT ?= smoke-out/$(HW)/$(JOB)
SMOKE_ARGS = --hw $(HW) --job $(JOB) --out $(SMOKE_OUT)$(if $(MODEL), --model-path $(MODEL))$(if $(STEPS), --steps $(STEPS))$(if $(BASELINE), --baseline $(BASELINE))$(if $(DEVICES), --devices $(DEVICES))
SMOKE_IMAGE = $(if $(IMAGE), --image $(IMAGE),$(if $(STACK), --stack $(STACK)))
.PHONY: help install bytecode render check lock build lint unit moves network cpu-run repro-arm64 services services-stop test smoke bench bench-quick clean

help: ## List every target with one line each
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

# Where PYTHONDONTWRITEBYTECODE is set (these CI machines set it) no process writes the bytecode it compiles,
# so every `ascendkit` a test starts compiled each module it imports again (a third of its start-up, over
# thousands of processes a run), and every pytest rewrote each test module's asserts again (half of its
# collection). Both written here once; a process still reads bytecode it is not allowed to write.
bytecode: $(STAMP) ## Compile the checkout's modules and pytest's rewritten test modules to bytecode; only what changed
	$(BIN)/python -m tests.harness.bytecode

# checkov has a venv of its own: its pins conflict with the dev tools' (packaging, cyclonedx-python-lib).
CHECKOV_VENV := .venv-checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov
CHECKOV_VERSION := 3.3.30
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)

$(CHECKOV_STAMP): $(STAMP)
	$(BIN)/uv venv --quiet --allow-existing --python $(PYTHON) $(CHECKOV_VENV)
	$(BIN)/uv pip install --quiet --python $(CHECKOV_VENV) checkov==$(CHECKOV_VERSION)
	@touch $@

install: $(STAMP) ## Create .venv and install ascendkit with its dev tools (pytest, ruff, mypy, hadolint)

render: $(STAMP) ## Validate the matrix and write every generated file (Dockerfiles, lock sections, schema, workflow, docs/matrix.md tables, docs/cli.md, docs/repositories/)
	$(BIN)/ascendkit matrix validate
	$(BIN)/ascendkit render --all
	@echo "Dockerfile for HW=$(HW)$(if $(STACK), STACK=$(STACK)): $(BIN)/ascendkit render --hw $(HW)$(if $(STACK), --stack $(STACK))"

# The inner loop: what catches most mistakes in under two minutes on two cores, with no engine, no
# network and no emulation. `make lint` and `make unit` run the rest (the external tools and the
# tests that take seconds); `make test` runs everything.
OFFLINE := HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9
UNIT_MARKS := not docker and not network and not matrix_moves

check: $(STAMP) bytecode ## The inner loop (under 2 min): ruff, mypy, the import contracts, render --check, and the unit tests not marked slow, on every core
	$(BIN)/ruff check buildkit tests benchmarks smoke_tests
	$(BIN)/ruff format --check buildkit tests benchmarks smoke_tests
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo
	$(BIN)/ascendkit render --check
	$(OFFLINE) $(BIN)/pytest -n auto -q -p no:cacheprovider -m "$(UNIT_MARKS) and not slow"

lock: $(STAMP) ## Re-lock every stack and arch (locks/); exit 8 when an index is unreachable and a lock stays unresolved
	$(BIN)/ascendkit lock --all

build: $(STAMP) ## Build, verify and tag the image for HW (STACK, ARCH: default the SKU hosts' arch, aarch64; emulated on x86_64)
	$(BIN)/ascendkit matrix validate
	$(BIN)/ascendkit build --hw $(HW)$(if $(STACK), --stack $(STACK))$(if $(ARCH), --arch $(ARCH))

WORKFLOW := .github/workflows/images.yml

lint: $(STAMP) $(CHECKOV_STAMP) ## ruff, mypy --strict, import contracts, shellcheck, hadolint, the CI workflow's linters, checkov, render --check
	$(BIN)/ruff check buildkit tests benchmarks smoke_tests
	$(BIN)/ruff format --check buildkit tests benchmarks smoke_tests
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo
	$(BIN)/shellcheck --severity=style buildkit/image/files/*.sh buildkit/k8s/files/*.sh
	$(BIN)/hadolint --config .hadolint.yaml $(RENDERED)
	$(BIN)/actionlint -config-file .github/actionlint.yaml -shellcheck $(BIN)/shellcheck -pyflakes= $(WORKFLOW)
	$(BIN)/zizmor --offline --config .github/zizmor.yml --persona pedantic --min-severity medium $(WORKFLOW)
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows $(WORKFLOW)
	$(BIN)/python -m tests.harness.scan --checkov $(CHECKOV)
	$(BIN)/ascendkit matrix validate
	$(BIN)/ascendkit render --check

unit: $(STAMP) $(CHECKOV_STAMP) bytecode ## Run every test that needs no Docker engine and no network (proxies dead, as in CI), on every core; about 5 min on two
	$(OFFLINE) $(BIN)/pytest -n auto --durations=25 -m "$(UNIT_MARKS)"

moves: $(STAMP) $(CHECKOV_STAMP) bytecode ## The matrix-moves check: the unit suite again in a copy with the default stack moved (CI's moves job)
	$(OFFLINE) $(BIN)/pytest -m matrix_moves

network: $(STAMP) bytecode ## Run the tests that need PyPI (resolving locks, downloading wheels and sdists), no engine
	$(BIN)/pytest -m "network and not docker"

CPU_RUN_OUT ?= cpu-run-out
cpu-run: $(STAMP) bytecode ## The smoke jobs run on CPU in each stack's own packages, to the accelerator boundary, and one training step (default stack and the newest of each framework, every job; STACK=S one, ALL=1 every stack; PLANT=0 without the planted failures; TEAM=0 without the team example on the default stack, tests/harness/cpu_team.py); report in cpu-run-out/
	$(BIN)/python -m tests.harness.cpu_run$(if $(filter 0,$(PLANT)),, --plant)$(if $(filter 0,$(TEAM)),, --team) --out $(CPU_RUN_OUT)$(if $(STACK), --stack $(STACK))$(if $(filter 1,$(ALL)), --all)
	$(BIN)/python benchmarks/bench_cpu_run.py --quick --report $(CPU_RUN_OUT)/cpu-report.json

repro-arm64: $(STAMP) ## The two clean arm64 builds under emulation, published and compared (about 4 min alone on two cores, 4.5 core-minutes of qemu; `make test` leaves them out for time); needs `make services ASCENDKIT_ARM64=1`
	set -a; . $(SERVICES_ENV); set +a; DOCKER_HOST="$$ASCENDKIT_EMULATED_DOCKER_HOST" ASCENDKIT_REQUIRE_DOCKER=1 ASCENDKIT_ARM64=1 \
	  $(BIN)/pytest -p no:cacheprovider --durations=5 -m arm64_pair

services: $(STAMP) ## As root: start dockerd, the registry on 127.0.0.1:5000 and the stand-in CANN base (ASCENDKIT_ARM64=1: also the arm64 stand-in and the emulated tests' own engine)
	$(BIN)/python -m tests.harness.services start $(ARM64_FLAG)
	@echo "now: set -a; . $(SERVICES_ENV); set +a"

services-stop: $(STAMP) ## Stop what `make services` started
	$(BIN)/python -m tests.harness.services stop

test: $(STAMP) bytecode ## What CI runs: lint, the services, every test, the quick benchmarks, at once where they can be (tests/harness/ci.py); stops the services
	$(BIN)/python -m tests.harness.ci $(ARM64_FLAG)

smoke: $(STAMP) ## Config check, doctor and smoke job (JOB=grpo|sft) of the HW image (STACK= or IMAGE=, MODEL= ...); no NPUs here: the config check only; STANDIN=1 without CANN (and its CPU run, smoke --cpu)
ifeq ($(STANDIN),1)
	$(BIN)/python -m tests.harness.services start
	set -a; . $(SERVICES_ENV); set +a; \
	  built=$$($(BIN)/ascendkit build --hw $(HW) --arch "$$(uname -m)" --matrix tests/fixtures/test_matrix.yaml --base-image "$$ASCENDKIT_STANDIN_IMAGE" \
	    --repo ascendkit-standin/verl --manifest-dir $(SERVICES_DIR)/manifests --quiet --json) && \
	  image=$$(printf '%s' "$$built" | $(BIN)/python -c 'import json, sys; print(json.load(sys.stdin)["tags"][0])') && \
	  echo "smoke: the test stack carries stand-in packages, not verl: no config for verl to compose (--no-config-check)" >&2 && \
	  { $(BIN)/ascendkit smoke --image "$$image" --no-config-check $(SMOKE_ARGS); status=$$?; \
	    if [ $$status = 10 ]; then echo "smoke: as far as a machine without NPUs goes: built, verified, doctor passed in the image" >&2; status=0; fi; \
	    [ $$status = 0 ] || exit $$status; \
	    echo "smoke: the CPU run of the image (smoke --cpu): its stand-in packages have no verl, so it must stop at an import, named" >&2; \
	    $(BIN)/ascendkit smoke --cpu --image "$$image" $(SMOKE_ARGS) >$(SERVICES_DIR)/standin-cpu.log 2>&1; cpu=$$?; \
	    cat $(SERVICES_DIR)/standin-cpu.log >&2; \
	    if [ $$cpu = 1 ] && grep -q "import" $(SERVICES_DIR)/standin-cpu.log; then echo "smoke: the CPU run named what the stand-in image lacks, as it must" >&2; \
	    else echo "smoke: the CPU run of the stand-in image did not name its missing framework (exit $$cpu)" >&2; exit 1; fi; }
else
	@if ls /dev/davinci[0-9]* >/dev/null 2>&1; then \
	  set -x; $(BIN)/ascendkit smoke$(SMOKE_IMAGE) $(SMOKE_ARGS); \
	else \
	  echo "smoke: no /dev/davinci* on this host: only the config check (the image's framework checks the job)" >&2; \
	  set -x; $(BIN)/ascendkit smoke --check$(SMOKE_IMAGE) $(SMOKE_ARGS); \
	fi
endif

RESULTS := benchmarks/results

bench: $(STAMP) bytecode ## CLI timings; with `make services` running, build timings, pip vs uv, size, wasted bytes, gzip vs zstd pulls, publishes through faults, a 4.5 GB image published and mirrored beside skopeo, BuildKit's registry cache against a classic cold build, an unchanged clean rebuild's bytes to pull, a cold containerd node to its first `import torch` (about 50 min, 30 GB of disk); printed and kept in benchmarks/results/
	@mkdir -p $(RESULTS)
	bash -o pipefail -c '$(BIN)/python benchmarks/bench_cli.py | tee $(RESULTS)/cli.txt'
	bash -o pipefail -c '$(BIN)/python benchmarks/bench_verify.py | tee $(RESULTS)/verify.txt'
	bash -o pipefail -c '$(BIN)/python benchmarks/bench_lock.py | tee $(RESULTS)/lock.txt'
	@if [ -f $(SERVICES_ENV) ]; then set -a; . $(SERVICES_ENV); set +a; \
	  bash -o pipefail -c '$(BIN)/python benchmarks/bench_build.py --out $(RESULTS)/build.json | tee $(RESULTS)/build.txt' && \
	  bash -o pipefail -c '$(BIN)/python benchmarks/bench_sbom.py | tee $(RESULTS)/sbom.txt' && \
	  bash -o pipefail -c '$(BIN)/python benchmarks/bench_ship.py --out $(RESULTS)/ship.json | tee $(RESULTS)/ship.txt' && \
	  bash -o pipefail -c '$(BIN)/python benchmarks/bench_size.py --out $(RESULTS)/size.json | tee $(RESULTS)/size.txt' && \
	  bash -o pipefail -c '$(BIN)/python benchmarks/bench_builders.py --out $(RESULTS)/builders.json | tee $(RESULTS)/builders.txt' && \
	  bash -o pipefail -c '$(BIN)/python benchmarks/bench_repro.py --out $(RESULTS)/repro.json | tee $(RESULTS)/repro.txt' && \
	  bash -o pipefail -c 'set -a; . $(SERVICES_DIR)/env.docker-overlay2; set +a; $(BIN)/python benchmarks/bench_repro.py --out $(RESULTS)/repro-overlay2.json | tee $(RESULTS)/repro-overlay2.txt' && \
	  bash -o pipefail -c '$(BIN)/python benchmarks/bench_coldnode.py --soci --json $(RESULTS)/coldnode.json | tee $(RESULTS)/coldnode.txt' && \
	  bash -o pipefail -c '$(BIN)/python benchmarks/bench_team_image.py --out $(RESULTS)/team.json | tee $(RESULTS)/team.txt'; \
	  else echo "bench_build, bench_ship: skipped (run \`make services\` first for build and shipping benchmarks)"; fi

# BENCH_ENGINE=docker-bench: on that engine of the services (CI's bench job, beside the tests); default: the main one.
# bench_builders empties the engine before each of its builds, so it goes first: bench_repro's first build of the
# test stack then leaves the cache that bench_build's and bench_sbom's rebuilds use, instead of a build of their own.
BENCH_ENV = $(if $(BENCH_ENGINE),$(SERVICES_DIR)/env.$(BENCH_ENGINE),$(SERVICES_ENV))

bench-quick: $(STAMP) bytecode ## Every benchmark once, briefly (part of `make test`: a benchmark that breaks fails CI); needs `make services`
	$(BIN)/python benchmarks/bench_cli.py --runs 1
	$(BIN)/python benchmarks/bench_verify.py --runs 1
	$(BIN)/python benchmarks/bench_lock.py --quick
	set -a; . $(BENCH_ENV); set +a; $(BIN)/python benchmarks/bench_builders.py --quick --out $(SERVICES_DIR)/bench-builders-quick.json && \
	  $(BIN)/python benchmarks/bench_repro.py --quick --out $(SERVICES_DIR)/bench-repro-quick.json && \
	  $(BIN)/python benchmarks/bench_build.py --quick --out $(SERVICES_DIR)/bench-build-quick.json && \
	  $(BIN)/python benchmarks/bench_sbom.py --runs 1 && \
	  $(BIN)/python benchmarks/bench_ship.py --quick --out $(SERVICES_DIR)/bench-ship-quick.json && \
	  $(BIN)/python benchmarks/bench_size.py --quick --out $(SERVICES_DIR)/bench-size-quick.json && \
	  $(BIN)/python benchmarks/bench_coldnode.py --quick --soci --json $(SERVICES_DIR)/bench-coldnode-quick.json && \
	  $(BIN)/python benchmarks/bench_team_image.py --quick --out $(SERVICES_DIR)/bench-team-quick.json

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
