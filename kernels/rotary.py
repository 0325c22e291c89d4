import torch

from gdserve.kernels.fp8_attention import rotate
from gdserve.kernels.triton import use_triton


def apply_rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           rotation: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, 1, D / 2]. Neox style (HF rotate_half): the two halves of the
    head dim form the complex pairs. rotation: [D, D], each rotated head then multiplied by it
    (kernels/fp8_attention.py's rotate)."""
    x1, x2 = x.chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out if rotation is None else rotate(out, rotation)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 rotation: torch.Tensor | None = None) -> torch.Tensor:
    """apply_rotary_reference, in one Triton pass on CUDA (same roundings; the rotation a
    tensor-core dot in x's dtype) -> new [T, heads, D]."""
    half = x.shape[-1] // 2
    if use_triton(x, "rotary") and x.stride(-1) == 1 and cos.dtype == x.dtype and half & (half - 1) == 0 \
            and (rotation is None or half >= 16):
        from gdserve.kernels.triton.rotary import apply_rotary_triton
        return apply_rotary_triton(x, cos, sin, None if rotation is None else rotation.to(x.dtype).contiguous())
    return apply_rotary_reference(x, cos, sin, rotation)
