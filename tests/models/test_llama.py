import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, MistralConfig, Qwen2Config

from gdserve.models import load_model
from gdserve.layers.attention import AttentionMetadata
from gdserve.layers.quantization import Fp8Linear
from tests.helpers import (TINY_LLAMA, bind_kv_cache, hf_logits, run_chunks,
                           run_prefill_and_decode, save_random_hf_model)

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}

VARIANTS = {
    "llama3-rope": lambda: LlamaConfig(**TINY_LLAMA, rope_scaling=LLAMA3_ROPE, rope_theta=500000.0,
                                       architectures=["LlamaForCausalLM"]),
    # head_dim 32 with 4 heads: num_heads * head_dim (128) != hidden (64)
    "llama-tied-headdim": lambda: LlamaConfig(**TINY_LLAMA, tie_word_embeddings=True, head_dim=32,
                                              architectures=["LlamaForCausalLM"]),
    "llama-linear-rope-bias": lambda: LlamaConfig(
        **TINY_LLAMA, rope_scaling={"rope_type": "linear", "factor": 2.0}, attention_bias=True,
        mlp_bias=True, architectures=["LlamaForCausalLM"]),
    "qwen2": lambda: Qwen2Config(**TINY_LLAMA, architectures=["Qwen2ForCausalLM"]),
    "mistral": lambda: MistralConfig(**TINY_LLAMA, head_dim=8, sliding_window=64,
                                     architectures=["MistralForCausalLM"]),
}
TOKENS = [1, 17, 200, 5, 99, 42, 42, 7, 128, 3, 250, 64, 8, 31]  # prompt 10 (3 blocks of 4), 4 decodes


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    """(HF model, our model) with the same random weights, via a saved checkpoint."""
    path = tmp_path_factory.mktemp(request.param)
    hf = save_random_hf_model(VARIANTS[request.param](), path)
    model, _ = load_model(path)
    return hf, model


def test_prefill_then_decode_matches_hf(pair):
    hf, model = pair
    ours = run_prefill_and_decode(model, TOKENS, prompt_len=10)
    torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=1e-4, rtol=1e-4)


def test_chunked_prefill_matches_hf(pair):
    hf, model = pair
    ours = run_chunks(model, TOKENS, [3, 6, 1, 4])
    torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_mixed_batch_matches_separate_runs(pair):
    """One step holding a decode of sequence A and the whole prefill of sequence B."""
    _, model = pair
    a, b, block_size = TOKENS[:9], TOKENS[3:], 4
    table_a, table_b = [5, 0, 3], [1, 4, 2, 6]
    bind_kv_cache(model, 8, block_size)
    positions, meta = AttentionMetadata.build([table_a], [0], [8], block_size)
    model(torch.tensor(a[:8]), positions, meta)
    positions, meta = AttentionMetadata.build([table_a, table_b], [8, 0], [1, len(b)], block_size)
    logits = model.compute_logits(model(torch.tensor([a[8]] + b), positions, meta))
    torch.testing.assert_close(logits[0], run_chunks(model, a, [8, 1])[-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1:], run_chunks(model, b, [len(b)]), atol=1e-5, rtol=1e-5)


def test_layers_bind_in_module_order(tiny_llama_dir):
    model, config = load_model(tiny_llama_dir)
    kv = bind_kv_cache(model, num_blocks=4, block_size=4)
    for i, layer in enumerate(model.model.layers):
        assert layer.self_attn.attn.k_cache.data_ptr() == kv[0, i].data_ptr()
        assert layer.self_attn.attn.v_cache.data_ptr() == kv[1, i].data_ptr()
    assert len(model.model.layers) == config.num_hidden_layers


def _hf_weights(path):
    return load_file(path / "model.safetensors")


def test_load_weights_rejects_unexpected_name(tiny_llama_dir):
    model, _ = load_model(tiny_llama_dir)
    weights = _hf_weights(tiny_llama_dir) | {"model.layers.0.self_attn.q_norm.weight": torch.ones(16)}
    with pytest.raises(ValueError, match="unexpected weight 'model.layers.0.self_attn.q_norm.weight'"):
        model.load_weights(weights.items())


def test_load_weights_reports_missing_names(tiny_llama_dir):
    model, _ = load_model(tiny_llama_dir)
    weights = _hf_weights(tiny_llama_dir)
    del weights["model.layers.1.mlp.up_proj.weight"], weights["lm_head.weight"]
    with pytest.raises(ValueError, match=r"lacks 2 weights: lm_head.weight, model.layers.1.mlp.up_proj"):
        model.load_weights(weights.items())


def test_load_weights_rejects_wrong_shape(tiny_llama_dir):
    model, _ = load_model(tiny_llama_dir)
    weights = _hf_weights(tiny_llama_dir)
    weights["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(64, 64)
    with pytest.raises(ValueError, match=r"k_proj.weight'.*\(64, 64\).*\(32, 64\)"):
        model.load_weights(weights.items())


def test_dummy_load_is_deterministic_and_finite(tiny_llama_dir):
    a, _ = load_model(tiny_llama_dir, load_format="dummy")
    b, _ = load_model(tiny_llama_dir, load_format="dummy", dtype=torch.bfloat16)
    assert b.lm_head.weight.dtype == torch.bfloat16
    torch.testing.assert_close(a.lm_head.weight.to(torch.bfloat16), b.lm_head.weight)
    logits = run_prefill_and_decode(b, TOKENS, prompt_len=10)
    assert logits.dtype == torch.bfloat16 and logits.isfinite().all()  # the LM head's dtype: the sampler widens them


def test_unknown_load_format(tiny_llama_dir):
    with pytest.raises(ValueError, match="load_format 'pt'"):
        load_model(tiny_llama_dir, load_format="pt")


def test_fp8_quantization_of_dummy_weights_keeps_the_head_and_runs(tiny_llama_dir):
    model, _ = load_model(tiny_llama_dir, load_format="dummy", dtype=torch.bfloat16, quantization="fp8")
    quantized = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert len(quantized) == 2 * 4 and all(m.weight.dtype == torch.float8_e4m3fn for m in quantized)
    assert model.lm_head.weight.dtype == torch.bfloat16
    logits = run_prefill_and_decode(model, TOKENS, prompt_len=10)
    assert logits.isfinite().all()


def test_fp8_quantization_needs_fp8_tensor_cores(tiny_llama_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(ValueError, match=r"quantization fp8 needs fp8 tensor cores .* NVIDIA A100 is 8.0"):
        load_model(tiny_llama_dir, device="cuda", quantization="fp8")
    with pytest.raises(ValueError, match="quantization 'int8': expected one of fp8"):
        load_model(tiny_llama_dir, quantization="int8")
