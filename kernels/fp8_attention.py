"""Attention with fp8 math, as FA3 and TensorRT-LLM run it over an fp8 KV cache: the torch
reference of the Triton kernels' FP8_MATH, and the CPU path where it is asked for.

Over an e4m3 cache (scale 1.0) each query row (one token's head) goes to e4m3 with its own scale
(its largest magnitude to FP8_MAX); a score is the fp8 dot times that scale and the softmax scale,
in float32; the probabilities go to e4m3 times P_SCALE; the output is their dot with V over the
sum of those same quantized probabilities, so the weights sum to one. The kernels take the softmax
a tile at a time, quantizing each probability against the running maximum rather than the row's:
the same rounding, applied at other points.
"""
import torch

FP8_MAX = 448.0  # e4m3's largest finite value
# A power of two (exact) that moves e4m3's smallest subnormal, 2^-9, down to 2^-17 for the
# probabilities; it cancels in the division by their sum.
P_SCALE = 256.0
MIN_HEAD_DIM = 32  # an fp8 tensor-core dot takes 32 values of its inner dimension a step


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
    p = (p * P_SCALE).to(torch.float8_e4m3fn).float()
    return (p @ v.float()) / p.sum(-1, keepdim=True)
