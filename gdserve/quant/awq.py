"""AutoAWQ's GEMM layout -> PackedWeight. qweight [K, N / 8] and qzeros [K / G, N / 8] int32 pack
8 columns (output features) per word in the interleaved order AWQ_ORDER; scales [K / G, N];
W[k, n] = (q[k, n] - zero[k // G, n]) * scale[k // G, n]."""
import torch

from gdserve.kernels.packed_gemm import PackedWeight, pack

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i (bits 4i..4i+3) of a word holds column AWQ_ORDER[i] of its 8
_NIBBLE_OF_COLUMN = tuple(AWQ_ORDER.index(column) for column in range(8))


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C / 8] in AWQ's order -> int32 [R, C] in [0, 16)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF              # [R, C / 8, nibble]
    return nibbles[..., list(_NIBBLE_OF_COLUMN)].reshape(packed.shape[0], -1)


def awq_to_packed(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                  dtype: torch.dtype) -> PackedWeight:
    q, zeros = unpack_awq(qweight), unpack_awq(qzeros)
    in_features, out_features = q.shape
    group_size = in_features if group_size == -1 else group_size
    groups = in_features // group_size
    if in_features % group_size or zeros.shape != (groups, out_features) or scales.shape != (groups, out_features):
        raise ValueError(f"AWQ tensors disagree: qweight unpacks to {tuple(q.shape)}, qzeros to "
                         f"{tuple(zeros.shape)}, scales {tuple(scales.shape)}, group_size {group_size}")
    scales = scales.float()
    return PackedWeight(pack(q, 4), scales.to(dtype), (-zeros * scales).to(dtype), 4, group_size)
