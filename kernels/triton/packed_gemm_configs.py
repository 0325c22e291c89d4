"""Tiles for packed_gemm_triton: (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) for the
tiled kernel, (BLOCK_N, BLOCK_K, SPLIT_K, num_warps) for the program-a-row one. Measured
best on an H200 for Llama-3-8B's linear layers with 4-bit weights in groups of 128
(`python3 scripts/packed_gemm_gpu.py` prints this table), by weight shape (N, K) and by the
smallest row count tuned that is >= M; a rule elsewhere."""
from functools import cache

import torch

Config = tuple[int, int, int, int, int, int]
GemvConfig = tuple[int, int, int, int]  # (BLOCK_N, BLOCK_K, SPLIT_K, num_warps): the row-a-program kernel

# Rows up to which each row streams the weight in a program of its own: at 2 rows that is already
# no faster than the tiled kernel (scripts/packed_gemm_gpu.py).
GEMV_MAX_ROWS = 1
# From this many rows the weight is dequantized once and cuBLAS multiplies: at 128 rows the tiled
# kernel is only as fast, at 64 it takes two thirds of the time.
DEQUANT_MIN_ROWS = 128

# (N, K) -> {rows: config}, for bits 4, group size 128
TUNED_SM90: dict[tuple[int, int], dict[int, Config]] = {
    (6144, 4096): {16: (16, 256, 128, 16, 4, 3), 64: (64, 64, 128, 4, 4, 3)},
    (4096, 4096): {16: (16, 256, 128, 16, 4, 3), 64: (64, 128, 128, 8, 4, 3)},
    (28672, 4096): {16: (16, 256, 128, 8, 4, 3), 64: (64, 128, 128, 4, 4, 4)},
    (4096, 14336): {16: (16, 256, 128, 16, 4, 3), 64: (64, 128, 128, 8, 4, 4)},
}
# (N, K) -> config at one row
TUNED_GEMV_SM90: dict[tuple[int, int], GemvConfig] = {
    (6144, 4096): (256, 128, 16, 4),
    (4096, 4096): (256, 128, 16, 4),
    (28672, 4096): (256, 128, 16, 4),
    (4096, 14336): (256, 128, 16, 4),
}
TUNED_BITS, TUNED_GROUP_SIZE = 4, 128
NUM_SMS_SM90 = 132


@cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def min_block_k(bits: int) -> int:
    """The tensor cores take at least 16 values of K a dot: 16 words' worth of values."""
    return 16 * (32 // bits)


def gemv_config_for(M: int, N: int, K: int, bits: int, group_size: int, device: torch.device) -> GemvConfig:
    on_sm90 = device.type == "cuda" and _capability(device.index or 0) == (9, 0)
    tuned = TUNED_GEMV_SM90.get((N, K)) if on_sm90 and (bits, group_size) == (TUNED_BITS, TUNED_GROUP_SIZE) else None
    if tuned is not None:
        return tuned
    # A tile within one group where the group allows (the scales apply once per tile), at least
    # 4 words deep.
    block_k = max(min(group_size, 256), 4 * (32 // bits))
    block_n = 128
    split_k = 1
    while -(-N // block_n) * M * split_k < 4 * NUM_SMS_SM90 and K // (block_k * split_k) >= 4:
        split_k *= 2
    return (block_n, block_k, split_k, 4)


def config_for(M: int, N: int, K: int, bits: int, group_size: int, device: torch.device) -> Config:
    on_sm90 = device.type == "cuda" and _capability(device.index or 0) == (9, 0)
    table = TUNED_SM90.get((N, K)) if on_sm90 and (bits, group_size) == (TUNED_BITS, TUNED_GROUP_SIZE) else None
    bucket = min((rows for rows in table or () if rows >= M), default=None)
    if bucket is not None:
        return table[bucket]
    block_m = min(max(16, 1 << (M - 1).bit_length()), 64)
    block_k = min_block_k(bits)
    if group_size % (2 * block_k) == 0:
        block_k *= 2  # still one group a tile: the scales apply once per tile
    block_n = 128 if N >= 8192 else 64
    # Few rows read the weight once: enough programs to keep every SM streaming it, from a split
    # over K where N alone gives too few tiles.
    tiles = -(-N // block_n) * -(-M // block_m)
    split_k = 1
    while tiles * split_k < 2 * NUM_SMS_SM90 and K // (block_k * split_k) >= 8:
        split_k *= 2
    return (block_m, block_n, block_k, split_k, 4, 3)


# The mma layout's kernel (packed_gemm_mma.py): (BLOCK_M, BLOCK_N, SPLIT_K, num_warps, num_stages,
# factored). factored: where a tile of K lies in one group, multiply the codes as they are and
# scale the tile's sums (fewer instructions a weight, two dots a tile), rather than dequantize
# each word before one dot into the accumulator.
MmaConfig = tuple[int, int, int, int, int, bool]
# The default takes the factored sums up to this many rows a tile (x's sums cost more with more).
MMA_FACTORED_MAX_ROWS = 32
# From this many rows the weight is dequantized once and cuBLAS multiplies.
MMA_DEQUANT_MIN_ROWS = 512


def mma_config_for(M: int, N: int, K: int, group_size: int, device: torch.device) -> MmaConfig | None:
    """The fused kernel's tile for M rows, or None where cuBLAS on the dequantized weight is
    faster. x's rows are the small side of the tensor cores' multiply (16 to 128 of them a
    tile); few tiles split K, so that every SM streams a share of the weight."""
    if M >= MMA_DEQUANT_MIN_ROWS:
        return None
    block_m = min(max(16, 1 << (M - 1).bit_length()), 128)
    # A group size that neither spans a tile nor divides one into words has its scales and biases
    # gathered a weight each, through shared memory: smaller tiles, fewer stages.
    gathered = group_size % 128 != 0 and (128 % group_size != 0 or group_size < 32)
    block_n = 64 if M <= 64 or gathered else 128
    tiles = -(-N // block_n) * -(-M // block_m)
    split_k = 1
    while tiles * split_k < 2 * NUM_SMS_SM90 and K // (128 * split_k) >= 8:
        split_k *= 2
    stages = 2 if gathered else 4 if M <= 16 else 3
    return (block_m, block_n, split_k, 4 if block_n == 64 else 8, stages, block_m <= MMA_FACTORED_MAX_ROWS)
