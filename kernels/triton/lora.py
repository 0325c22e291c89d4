"""Multi-LoRA deltas in two passes, as Punica does: shrink (h = x @ A^T into a float32 [T, shards * R]
buffer) and expand (y += h @ B^T, every shard in one launch). Both take the tokens grouped by slot
(kernels/lora_groups.py's LoRAGroups, on the device): a program (slot, m, ...) gathers the rows
m * BLOCK_M.. of its slot's group and multiplies them by its slot's weights with tensor-core
tiles, returning at once where the group is shorter. The grid and the tiles are functions of the
shapes only, so a CUDA graph captured for T tokens replays right for any mapping."""
import itertools
from functools import cache

import torch
import triton
import triton.language as tl

from gdserve.kernels.lora_groups import LoRAGroups


@triton.jit
def _group_rows(sorted_ptr, starts_ptr, slot, count, T, BLOCK_M: tl.constexpr):
    """The token rows (int64) this program takes, with their mask: rows m * BLOCK_M.. of its
    slot's group, those below T (a narrowed mapping shares its parent's groups, which may hold
    later tokens)."""
    pos = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_group = pos < count
    rows = tl.load(sorted_ptr + tl.load(starts_ptr + slot) + pos, mask=in_group, other=0)
    return rows.to(tl.int64), in_group & (rows < T)


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, h_ptr, sorted_ptr, counts_ptr, starts_ptr, T, K, C,
                   stride_xt, stride_as, stride_ht,
                   BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    slot = tl.program_id(0)
    count = tl.load(counts_ptr + slot)
    if tl.program_id(1) * BLOCK_M < count:
        rows, row_ok = _group_rows(sorted_ptr, starts_ptr, slot, count, T, BLOCK_M)
        pid_c, pid_k = tl.program_id(2) // SPLIT_K, tl.program_id(2) % SPLIT_K
        rc = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        rk = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rows[:, None] * stride_xt + rk[None, :]
        a_ptrs = a_ptr + slot.to(tl.int64) * stride_as + rc[None, :] * K + rk[:, None]  # [BLOCK_K, BLOCK_C]
        acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
        for k in range(pid_k * BLOCK_K, K, SPLIT_K * BLOCK_K):
            x = tl.load(x_ptrs + k, mask=row_ok[:, None] & (k + rk[None, :] < K), other=0.0)
            a = tl.load(a_ptrs + k, mask=(rc[None, :] < C) & (k + rk[:, None] < K), other=0.0)
            acc = tl.dot(x, a, acc, input_precision=DOT_PRECISION)
        h_ptrs = h_ptr + rows[:, None] * stride_ht + rc[None, :]
        mask = row_ok[:, None] & (rc[None, :] < C)
        if SPLIT_K == 1:
            tl.store(h_ptrs, acc, mask=mask)
        else:
            tl.atomic_add(h_ptrs, acc, mask=mask, sem="relaxed")


@triton.jit
def _expand_kernel(h_ptr, b_ptr, y_ptr, sorted_ptr, counts_ptr, starts_ptr, T, R,
                   stride_ht, stride_bs, stride_yt,
                   SHARD_BOUNDS: tl.constexpr, NUM_SHARDS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """Shard i owns y's columns SHARD_BOUNDS[i]..SHARD_BOUNDS[i + 1] and h's i-th block of R."""
    slot = tl.program_id(0)
    count = tl.load(counts_ptr + slot)
    if tl.program_id(1) * BLOCK_M < count:
        rows, row_ok = _group_rows(sorted_ptr, starts_ptr, slot, count, T, BLOCK_M)
        n0 = tl.program_id(2) * BLOCK_N
        rn = n0 + tl.arange(0, BLOCK_N)
        rr = tl.arange(0, BLOCK_R)
        h_ptrs = h_ptr + rows[:, None] * stride_ht + rr[None, :]
        b_ptrs = b_ptr + slot.to(tl.int64) * stride_bs + rn[None, :] * R + rr[:, None]  # [BLOCK_R, BLOCK_N]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in tl.static_range(NUM_SHARDS):
            lo, hi = SHARD_BOUNDS[i], SHARD_BOUNDS[i + 1]
            if (n0 < hi) & (n0 + BLOCK_N > lo):
                h = tl.load(h_ptrs + i * R, mask=row_ok[:, None] & (rr[None, :] < R), other=0.0)
                b = tl.load(b_ptrs, mask=(rn[None, :] >= lo) & (rn[None, :] < hi) & (rr[:, None] < R), other=0.0)
                # h goes to the weights' dtype for the tensor cores, as Punica does (float32 stays float32).
                acc = tl.dot(h.to(b.dtype), b, acc, input_precision=DOT_PRECISION)
        y_ptrs = y_ptr + rows[:, None] * stride_yt + rn[None, :]
        mask = row_ok[:, None] & (rn[None, :] < SHARD_BOUNDS[NUM_SHARDS])
        y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptrs, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs


@cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def block_m_for(num_tokens: int) -> int:
    """Rows per program: small tiles for decode-size steps, whose groups are short."""
    return 16 if num_tokens <= 256 else 64


def split_k_for(num_tokens: int, k: int, c: int, device: torch.device, block_m: int, block_c: int,
                block_k: int) -> int:
    """Split shrink over K where the row tiles alone (as if one slot had all the tokens) give too
    few programs for the SMs."""
    programs = triton.cdiv(num_tokens, block_m) * triton.cdiv(c, block_c)
    return max(1, min(triton.cdiv(2 * _num_sms(device), programs), triton.cdiv(k, block_k)))


def shrink(x: torch.Tensor, lora_a: torch.Tensor, groups: LoRAGroups, block_m: int | None = None, block_c: int = 64,
           block_k: int = 128, split_k: int | None = None) -> torch.Tensor:
    """h [T, shards * R] float32 = x[t] @ lora_a[slot_t].view(-1, K).T for each grouped token t
    (rows of the others undefined). A split over K adds float32 atomically into a zeroed h."""
    (t, k), c = x.shape, lora_a.shape[1] * lora_a.shape[2]
    block_m = block_m or block_m_for(t)
    block_c = min(block_c, max(16, triton.next_power_of_2(c)))
    split_k = split_k or split_k_for(t, k, c, x.device, block_m, block_c, block_k)
    h = (torch.zeros if split_k > 1 else torch.empty)(t, c, dtype=torch.float32, device=x.device)
    num_slots = groups.slot_counts.shape[0]
    if t and num_slots:
        grid = (num_slots, triton.cdiv(t, block_m), triton.cdiv(c, block_c) * split_k)
        _shrink_kernel[grid](x, lora_a, h, groups.sorted_indices, groups.slot_counts, groups.slot_starts, t, k, c,
                             x.stride(0), lora_a.stride(0), h.stride(0), BLOCK_M=block_m, BLOCK_C=block_c,
                             BLOCK_K=block_k, SPLIT_K=split_k, DOT_PRECISION=_dot_precision(x.dtype))
    return h


def expand(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, shard_sizes: tuple[int, ...], groups: LoRAGroups,
           block_m: int | None = None, block_n: int = 128) -> None:
    """y[t, shard i] += h[t, rank block i] @ lora_b[slot_t, shard i].T for each grouped token t:
    y [T, N] (N = sum(shard_sizes)), h [T, shards * R] float32, lora_b [slots, N, R] contiguous."""
    (t, n), rank = y.shape, lora_b.shape[2]
    assert lora_b.is_contiguous() and y.stride(1) == 1 and h.stride(1) == 1 and n == sum(shard_sizes)
    block_m = block_m or block_m_for(t)
    num_slots = groups.slot_counts.shape[0]
    if t and num_slots:
        bounds = (0, *itertools.accumulate(shard_sizes))
        grid = (num_slots, triton.cdiv(t, block_m), triton.cdiv(n, block_n))
        _expand_kernel[grid](h, lora_b, y, groups.sorted_indices, groups.slot_counts, groups.slot_starts, t, rank,
                             h.stride(0), lora_b.stride(0), y.stride(0), SHARD_BOUNDS=bounds,
                             NUM_SHARDS=len(shard_sizes), BLOCK_M=block_m, BLOCK_N=block_n,
                             BLOCK_R=max(16, triton.next_power_of_2(rank)), DOT_PRECISION=_dot_precision(y.dtype))


def add_lora_triton(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                    shard_sizes: tuple[int, ...], groups: LoRAGroups) -> None:
    """gdserve.kernels.lora.add_lora (validated there): two launches (three with a split over K),
    reading only device tensors."""
    expand(y, shrink(x, lora_a, groups), lora_b, tuple(shard_sizes), groups)
