"""Round-to-nearest quantization of a dense weight, asymmetric per group (min to max in 2**bits
steps): random-weight models for benchmarks of the packed formats."""
import torch

from gdserve.kernels.packed_gemm import PackedWeight, pack


def rtn_quantize(weight: torch.Tensor, bits: int = 4, group_size: int = 128,
                 dtype: torch.dtype | None = None) -> PackedWeight:
    """weight [K, N] (in x out) -> PackedWeight; dtype of scales and biases (default: weight's)."""
    in_features, out_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide in_features {in_features}")
    groups = weight.float().view(in_features // group_size, group_size, out_features)
    low, high = groups.amin(dim=1), groups.amax(dim=1)                      # [K / G, N]
    scales = ((high - low) / (2 ** bits - 1)).clamp(min=torch.finfo(torch.float32).tiny)
    q = ((groups - low[:, None]) / scales[:, None]).round().clamp(0, 2 ** bits - 1)
    dtype = dtype or weight.dtype
    return PackedWeight(pack(q.view(in_features, out_features).to(torch.int32), bits), scales.to(dtype),
                        low.to(dtype), bits, group_size)
