import pytest
import torch

from gdserve.kernels.fp8_attention import MIN_HEAD_DIM, rotation
from gdserve.kernels.rotary import apply_rotary, apply_rotary_reference
from gdserve.layers.rotary import RotaryEmbedding
from tests.kernels.triton_cases import DEVICE, ON_CUDA, bf16_tol, randn, requires_triton

pytestmark = requires_triton
# (tokens, q heads + kv heads, head dim): q and k rotate together, as the model calls it.
SHAPES = [(1, 40, 128), (300, 40, 128), (77, 12, 64)] if ON_CUDA else [(3, 6, 64), (5, 20, 128), (2, 3, 16)]
# The interpreter's tl.dot multiplies bfloat16 as raw bits: float16 there, bfloat16 on CUDA.
HALF_DTYPE = torch.bfloat16 if ON_CUDA else torch.float16


def rotary_inputs(tokens: int, heads: int, head_dim: int, dtype: torch.dtype):
    """(x, cos, sin): x a strided view, as the model passes it (q and k sit inside the fused qkv
    projection's output)."""
    rope = RotaryEmbedding(head_dim, 4096, 500000.0).to(DEVICE)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(tokens)).to(DEVICE)
    cos, sin = rope(positions, dtype)
    qkv = randn(tokens, heads + 4, head_dim, dtype=dtype, scale=2)
    return qkv[:, :heads], cos, sin


@pytest.mark.parametrize("tokens,heads,head_dim", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(tokens, heads, head_dim, dtype):
    from gdserve.kernels.triton.rotary import apply_rotary_triton
    x, cos, sin = rotary_inputs(tokens, heads, head_dim, dtype)
    out = apply_rotary_triton(x, cos, sin)
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else bf16_tol()
    torch.testing.assert_close(out, apply_rotary_reference(x, cos, sin), **tol)


@pytest.mark.parametrize("tokens,heads,head_dim", [s for s in SHAPES if s[2] >= MIN_HEAD_DIM])
@pytest.mark.parametrize("dtype", [torch.float32, HALF_DTYPE])
def test_rotation_matches_reference(tokens, heads, head_dim, dtype):
    """fp8 attention's turn of queries and keys, fused: each rotated head times the rotation,
    accumulated in float32 and rounded once to the input dtype, as a GEMM in that dtype rounds."""
    from gdserve.kernels.triton.rotary import apply_rotary_triton
    x, cos, sin = rotary_inputs(tokens, heads, head_dim, dtype)
    rot = rotation(head_dim).to(DEVICE, dtype)
    out = apply_rotary_triton(x, cos, sin, rot)
    if dtype == torch.float32:
        torch.testing.assert_close(out, apply_rotary_reference(x, cos, sin, rot), atol=1e-5, rtol=1e-5)
        return
    # Against the exact product of the kernel's own rotary output (checked above): within the
    # final rounding (half an ulp, plus the accumulation order's last bits).
    exact = apply_rotary_triton(x, cos, sin).float() @ rot.float()
    ulp = torch.finfo(dtype).eps  # the spacing above 1: an ulp relative to the value, at most
    assert ((out.float() - exact).abs() <= exact.abs() * ulp + 1e-3).all()


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
def test_public_op_dispatches_on_cuda():
    rope = RotaryEmbedding(128, 1024, 10000.0).to(DEVICE)
    cos, sin = rope(torch.arange(9, device=DEVICE), torch.bfloat16)
    x = randn(9, 5, 128, dtype=torch.bfloat16)
    from gdserve.kernels.triton.rotary import apply_rotary_triton
    torch.testing.assert_close(apply_rotary(x, cos, sin), apply_rotary_triton(x, cos, sin), atol=0, rtol=0)
    rot = rotation(128).to(DEVICE)  # float32: the op casts it to x's dtype
    torch.testing.assert_close(apply_rotary(x, cos, sin, rot),
                               apply_rotary_triton(x, cos, sin, rot.bfloat16()), atol=0, rtol=0)
