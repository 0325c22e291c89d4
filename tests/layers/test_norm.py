import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from gdserve.layers.activation import SiluAndMul
from gdserve.layers.norm import RMSNorm


def _norms(hidden: int, dtype: torch.dtype) -> tuple[RMSNorm, LlamaRMSNorm]:
    ours, hf = RMSNorm(hidden, eps=1e-5), LlamaRMSNorm(hidden, eps=1e-5)
    weight = torch.randn(hidden)
    ours.weight.data.copy_(weight)
    hf.weight.data.copy_(weight)
    return ours.to(dtype), hf.to(dtype)


# The native CPU kernel sums the variance in another order than torch: allow an ulp.
TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_hf(dtype):
    ours, hf = _norms(64, dtype)
    x = torch.randn(5, 64, dtype=dtype) * 3
    torch.testing.assert_close(ours(x), hf(x), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_returns_norm_of_sum_and_sum(dtype):
    ours, hf = _norms(64, dtype)
    x, residual = torch.randn(5, 64, dtype=dtype), torch.randn(5, 64, dtype=dtype)
    expected_sum = residual + x
    normed, new_residual = ours(x, residual)
    torch.testing.assert_close(new_residual, expected_sum, atol=0, rtol=0)
    torch.testing.assert_close(normed, hf(expected_sum), atol=TOL[dtype], rtol=TOL[dtype])


def test_silu_and_mul_splits_gate_then_up():
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    out = SiluAndMul()(torch.cat([gate, up], dim=-1))
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up)
