"""GPTQ (AutoGPTQ / GPTQModel) -> PackedWeight. qweight [K * bits / 32, N] packs along K, low bits
first (PackedWeight's own order); qzeros [groups, N * bits / 32] packs along N the same way;
scales [groups, N]; g_idx [K]: the group of each input row. W[k, n] = (q[k, n] - zero) * scale with
the group g_idx[k]'s zero and scale. desc_act checkpoints quantize the rows in another order, so
a group's rows are scattered: they are stored sorted by group, and the layer reads x's columns
in the same order (perm)."""
import torch

from gdserve.kernels.packed_gemm import PackedWeight, pack, unpack
from gdserve.quant.config import PackedProjection


def gptq_to_packed(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                   g_idx: torch.Tensor | None, bits: int, group_size: int, zero_offset: int,
                   dtype: torch.dtype) -> PackedProjection:
    in_features = qweight.shape[0] * 32 // bits
    group_size = in_features if group_size == -1 else group_size
    zeros = unpack(qzeros.t().contiguous(), bits).t().to(torch.int32) + zero_offset   # [groups, N]
    groups = in_features // group_size
    if in_features % group_size or zeros.shape != scales.shape or scales.shape != (groups, qweight.shape[1]):
        raise ValueError(f"GPTQ tensors disagree: qweight {tuple(qweight.shape)} ({bits}-bit), qzeros "
                         f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)}, group_size {group_size}")
    perm = _row_order(g_idx, in_features, group_size)
    if perm is not None:
        qweight = pack(unpack(qweight, bits)[perm], bits)
    scales = scales.float()
    weight = PackedWeight(qweight.to(torch.int32), scales.to(dtype), (-zeros * scales).to(dtype), bits, group_size)
    return PackedProjection(weight, perm)


def _row_order(g_idx: torch.Tensor | None, in_features: int, group_size: int) -> torch.Tensor | None:
    """None when row k is in group k // group_size; else the rows sorted by group (stable)."""
    plain = torch.arange(in_features) // group_size
    if g_idx is None or torch.equal(g_idx.long(), plain):
        return None
    g_idx = g_idx.long()
    counts = torch.bincount(g_idx, minlength=in_features // group_size)
    if g_idx.shape != (in_features,) or (counts != group_size).any():
        raise ValueError(f"g_idx does not put {group_size} of the {in_features} input rows in each group")
    return torch.argsort(g_idx, stable=True)
