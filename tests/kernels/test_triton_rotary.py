import pytest
import torch

from gdserve.kernels.rotary import apply_rotary, apply_rotary_reference
from gdserve.layers.rotary import RotaryEmbedding
from tests.kernels.triton_cases import DEVICE, ON_CUDA, bf16_tol, randn, requires_triton

pytestmark = requires_triton
# (tokens, q heads + kv heads, head dim): q and k rotate together, as the model calls it.
SHAPES = [(1, 40, 128), (300, 40, 128), (77, 12, 64)] if ON_CUDA else [(3, 6, 64), (5, 20, 128), (2, 3, 16)]


@pytest.mark.parametrize("tokens,heads,head_dim", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(tokens, heads, head_dim, dtype):
    from gdserve.kernels.triton.rotary import apply_rotary_triton
    rope = RotaryEmbedding(head_dim, 4096, 500000.0).to(DEVICE)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(tokens)).to(DEVICE)
    cos, sin = rope(positions, dtype)
    # A strided view, as the model passes it: q and k sit inside the fused qkv projection's output.
    qkv = randn(tokens, heads + 4, head_dim, dtype=dtype, scale=2)
    x = qkv[:, :heads]
    out = apply_rotary_triton(x, cos, sin)
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else bf16_tol()
    torch.testing.assert_close(out, apply_rotary_reference(x, cos, sin), **tol)


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
def test_public_op_dispatches_on_cuda():
    rope = RotaryEmbedding(128, 1024, 10000.0).to(DEVICE)
    cos, sin = rope(torch.arange(9, device=DEVICE), torch.bfloat16)
    x = randn(9, 5, 128, dtype=torch.bfloat16)
    from gdserve.kernels.triton.rotary import apply_rotary_triton
    torch.testing.assert_close(apply_rotary(x, cos, sin), apply_rotary_triton(x, cos, sin), atol=0, rtol=0)
