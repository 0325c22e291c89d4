"""Attention with fp8 scores over an fp8 KV cache: the torch reference of the Triton prefill
kernel's FP8_MATH, and the CPU path where it is asked for.

Over an e4m3 cache (scale 1.0) each query row (one token's head) goes to e4m3 with its own scale
(its largest magnitude to FP8_MAX); a score is the fp8 dot of that row with the cached key times
the row's scale and the softmax scale, in float32. The probabilities multiply V in float16, which
holds the cache's e4m3 values exactly, and their float32 sum divides. The scores' dot is where fp8
pays on a GPU (twice float16's tensor-core rate; the P.V dot in fp8 measured slower in Triton, the
module kernels/triton/paged_attention.py says why).

Queries and keys are turned by one fixed orthogonal matrix (`rotation`) before the keys are
cached, as FA3's incoherent processing does: their dot products stay, while a score that a few
outlier channels carry is spread over all of them, so that rounding each value to three mantissa
bits no longer moves it by a sizeable fraction.
"""
import math
from functools import cache

import torch

FP8_MAX = 448.0  # e4m3's largest finite value
MIN_HEAD_DIM = 32  # an fp8 tensor-core dot takes 32 values of its inner dimension a step


@cache
def _rotation(head_dim: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(head_dim)
    if head_dim & (head_dim - 1):  # not a power of two: a random orthogonal matrix
        return torch.linalg.qr(torch.randn(head_dim, head_dim, generator=g, dtype=torch.float64))[0].float()
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < head_dim:  # Sylvester's construction
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    signs = torch.where(torch.rand(head_dim, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (signs[:, None] * h / math.sqrt(head_dim)).float()  # a Hadamard matrix, rows' signs drawn


def rotation(head_dim: int) -> torch.Tensor:
    """[D, D] float32, orthogonal, every entry of magnitude about 1/sqrt(D): the same for every
    layer and process (seeded by D)."""
    return _rotation(head_dim).clone()


def rotate(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x: [..., D] times rot, in x's dtype (one GEMM where rot is already of that dtype; in bf16
    the rotation's own rounding, 2^-9 of a value, is far below e4m3's 2^-4)."""
    return x @ rot.to(x.dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., D] -> (its e4m3 values as float32, the per-row scale [..., 1]): x ~ values * scale."""
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float(), scale


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """q: [..., Q, D]; k, v: [..., L, D] holding e4m3 values (any float type); mask: broadcast to
    [..., Q, L], True where a key is seen (each row sees one at least). Returns [..., Q, D] float32."""
    q8, row_scale = quantize_rows(q)
    s = (q8 @ k.float().transpose(-1, -2)) * (row_scale * scale)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p.half().float() @ v.float()) / p.sum(-1, keepdim=True)
