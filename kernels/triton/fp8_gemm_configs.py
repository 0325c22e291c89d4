"""Tiles for fp8_gemm_triton: (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages). Measured
best on an H200 for Llama-3-8B's linear layers (`python3 scripts/fp8_gemm_gpu.py` prints this
table), by weight shape (N, K) and by the smallest row count tuned that is >= M; a rule elsewhere."""
from functools import cache

import torch

Config = tuple[int, int, int, int, int, int]

# (N, K) -> {rows: config}
TUNED_SM90: dict[tuple[int, int], dict[int, Config]] = {
    (6144, 4096): {16: (16, 64, 128, 4, 4, 3), 32: (32, 64, 128, 4, 4, 3), 64: (64, 64, 128, 1, 4, 3),
                   128: (64, 128, 128, 1, 8, 3)},
    (4096, 4096): {16: (16, 128, 256, 4, 4, 3), 32: (32, 128, 256, 4, 4, 3), 64: (64, 32, 128, 1, 4, 3),
                   128: (64, 64, 128, 1, 4, 3)},
    (28672, 4096): {16: (16, 128, 256, 1, 4, 3), 32: (32, 128, 256, 1, 4, 3), 64: (64, 64, 128, 1, 4, 3),
                    128: (128, 128, 128, 1, 8, 5)},
    (4096, 14336): {16: (16, 64, 128, 4, 4, 5), 32: (32, 128, 128, 4, 4, 5), 64: (64, 64, 128, 4, 4, 5),
                    128: (128, 128, 128, 4, 8, 5)},
}


@cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def config_for(M: int, N: int, K: int, device: torch.device) -> Config:
    on_sm90 = device.type == "cuda" and _capability(device.index or 0) == (9, 0)
    table = TUNED_SM90.get((N, K)) if on_sm90 else None
    bucket = min((rows for rows in table or () if rows >= M), default=None)
    if bucket is not None:
        return table[bucket]
    block_m = min(max(16, 1 << (M - 1).bit_length()), 64)
    # Few rows read the weight once: enough programs to keep every SM streaming it, from wide
    # tiles over a wide N or from a split over a deep K.
    return (block_m, 128 if N >= 16384 else 64, 256, 4 if K >= 8192 else 1, 4, 3)
