import torch

from gdserve.kernels.triton import use_triton


def apply_rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, 1, D / 2]. Neox style (HF rotate_half): the two halves of the
    head dim form the complex pairs."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_reference, in one Triton pass on CUDA (same roundings) -> new [T, heads, D]."""
    half = x.shape[-1] // 2
    if use_triton(x, "rotary") and x.stride(-1) == 1 and cos.dtype == x.dtype and half & (half - 1) == 0:
        from gdserve.kernels.triton.rotary import apply_rotary_triton
        return apply_rotary_triton(x, cos, sin)
    return apply_rotary_reference(x, cos, sin)
