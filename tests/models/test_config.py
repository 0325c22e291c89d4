from types import SimpleNamespace

import pytest
from transformers import LlamaConfig, MistralConfig, Qwen2Config

from gdserve.models.config import ModelConfig

SMALL = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def test_transformers5_rope_parameters():
    hf = LlamaConfig(**SMALL, rope_theta=500000.0, rope_scaling={"rope_type": "llama3", **LLAMA3_ROPE},
                     architectures=["LlamaForCausalLM"])
    assert "rope_parameters" in hf.to_dict()
    config = ModelConfig.from_hf(hf)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == {"rope_type": "llama3", **LLAMA3_ROPE}
    assert (config.head_dim, config.num_key_value_heads, config.attention_bias) == (16, 2, False)


def test_transformers4_rope_theta_and_rope_scaling():
    """A 4.x-style config object: theta and scaling as separate attributes, legacy 'type' key."""
    hf = SimpleNamespace(**SMALL, architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5,
                         rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0},
                         tie_word_embeddings=True)
    config = ModelConfig.from_hf(hf)
    assert (config.rope_theta, config.rope_scaling) == (10000.0, {"rope_type": "linear", "factor": 2.0})
    assert config.tie_word_embeddings and config.sliding_window is None


def test_default_rope_has_no_scaling():
    config = ModelConfig.from_hf(LlamaConfig(**SMALL, architectures=["LlamaForCausalLM"]))
    assert config.rope_scaling is None


def test_unsupported_architecture_is_named_with_the_supported_list():
    hf = LlamaConfig(**SMALL, architectures=["GPTNeoXForCausalLM"])
    with pytest.raises(ValueError, match=r"GPTNeoXForCausalLM.*LlamaForCausalLM, MistralForCausalLM, "
                                         r"Qwen2ForCausalLM"):
        ModelConfig.from_hf(hf)


def test_unsupported_activation():
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        ModelConfig.from_hf(LlamaConfig(**SMALL, hidden_act="gelu", architectures=["LlamaForCausalLM"]))


def test_qwen2_has_qkv_bias_and_no_window_unless_enabled():
    config = ModelConfig.from_hf(Qwen2Config(**SMALL, sliding_window=1024,
                                             architectures=["Qwen2ForCausalLM"]))
    assert config.attention_bias and not config.o_proj_bias
    assert config.sliding_window is None and config.max_model_len_cap == 4096


def test_qwen2_sliding_window_in_use_caps_model_len():
    hf = Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=1024, max_window_layers=1,
                     architectures=["Qwen2ForCausalLM"])
    config = ModelConfig.from_hf(hf)
    assert (config.sliding_window, config.max_model_len_cap) == (1024, 1024)


def test_mistral_sliding_window_caps_model_len():
    hf = MistralConfig(**SMALL, sliding_window=2048, architectures=["MistralForCausalLM"])
    assert ModelConfig.from_hf(hf).max_model_len_cap == 2048
    hf = MistralConfig(**SMALL, sliding_window=None, architectures=["MistralForCausalLM"])
    assert ModelConfig.from_hf(hf).max_model_len_cap == 4096


def test_llama_attention_bias_covers_o_proj():
    config = ModelConfig.from_hf(LlamaConfig(**SMALL, attention_bias=True,
                                             architectures=["LlamaForCausalLM"]))
    assert config.attention_bias and config.o_proj_bias


def test_a_checkpoint_quantized_ahead_of_time_is_refused_naming_the_way_to_quantize():
    hf = LlamaConfig(**SMALL, architectures=["LlamaForCausalLM"],
                     quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"})
    with pytest.raises(ValueError, match=r"quant_method 'fp8' are not supported \(only awq, gptq\).*--quantization fp8"):
        ModelConfig.from_hf(hf)
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128}
    assert ModelConfig.from_hf(LlamaConfig(**SMALL, architectures=["LlamaForCausalLM"], quantization_config=awq))


@pytest.mark.parametrize("size,heads,kv_heads,message", [
    (2, 9, 3, "tensor_parallel_size 2 does not divide the model's 9 attention heads, "
              r"3 KV heads \(neither divisible by it nor dividing it\)"),
    (8, 16, 4, None),    # fewer KV heads than ranks: each is replicated on 2 ranks
    (4, 16, 8, None),
    (3, 8, 2, "8 attention heads, 2 KV heads"),
])
def test_tensor_parallel_sizes_must_split_heads_and_features(size, heads, kv_heads, message):
    config = ModelConfig.from_hf(LlamaConfig(**{**SMALL, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                                                "hidden_size": 16 * heads,
                                                "intermediate_size": 96}, architectures=["LlamaForCausalLM"]))
    if message is None:
        config.check_tensor_parallel(size)
    else:
        with pytest.raises(ValueError, match=message):
            config.check_tensor_parallel(size)
