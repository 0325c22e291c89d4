import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from gdserve.layers.rotary import RotaryEmbedding, apply_rotary
from gdserve.models.config import ModelConfig

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    # original_max 64 with head_dim 32: some frequencies kept, some blended, some slowed
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_hf_apply_rotary_pos_emb(scaling, dtype):
    hf_config = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=1024, rope_theta=500000.0,
                            rope_scaling=SCALINGS[scaling], architectures=["LlamaForCausalLM"])
    config = ModelConfig.from_hf(hf_config)
    rope = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta,
                           config.rope_scaling)
    positions = torch.tensor([0, 1, 2, 63, 64, 500, 1023, 7])
    q = torch.randn(len(positions), 4, 32, dtype=dtype)  # [T, H, D]
    k = torch.randn(len(positions), 2, 32, dtype=dtype)  # [T, KVH, D]
    cos, sin = LlamaRotaryEmbedding(hf_config)(q, positions[None])  # [1, T, D]
    # HF's layout is [B, H, T, D]: put T on dim 2 and back.
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    cos_sin = rope(positions, dtype)
    our_q, our_k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
    torch.testing.assert_close(our_q, hf_q[0].transpose(0, 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(our_k, hf_k[0].transpose(0, 1), atol=1e-6, rtol=0)


def test_unsupported_rope_type_is_named():
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'yarn'.*llama3"):
        RotaryEmbedding(32, 128, 10000.0, {"rope_type": "yarn", "factor": 4.0})
