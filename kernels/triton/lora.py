"""Multi-LoRA deltas in two passes, as Punica does: shrink (h = x @ A^T into a float32 [T, shards * R]
buffer) and expand (y += h @ B^T, shard by shard). SGMV: programs over segments of consecutive
tokens sharing an adapter, with tensor-core tiles (prefill). BGMV: one program row per token, its
slot read on the device, so a CUDA graph replays it for any mapping (decode)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_bgmv_kernel(x_ptr, a_ptr, h_ptr, slots_ptr, K, C, stride_xt, stride_as, stride_ht,
                        BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    t, pid_c, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        rc = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + slot.to(tl.int64) * stride_as + rc[:, None] * K + rk[None, :]
        x_ptrs = x_ptr + t.to(tl.int64) * stride_xt + rk
        acc = tl.zeros((BLOCK_C, BLOCK_K), dtype=tl.float32)
        for k in range(pid_k * BLOCK_K, K, SPLIT_K * BLOCK_K):
            x = tl.load(x_ptrs + k, mask=k + rk < K, other=0.0).to(tl.float32)
            a = tl.load(a_ptrs + k, mask=(rc[:, None] < C) & (k + rk[None, :] < K), other=0.0)
            acc += a.to(tl.float32) * x[None, :]
        h = tl.sum(acc, axis=1)
        h_ptrs = h_ptr + t.to(tl.int64) * stride_ht + rc
        if SPLIT_K == 1:
            tl.store(h_ptrs, h, mask=rc < C)
        else:
            tl.atomic_add(h_ptrs, h, mask=rc < C, sem="relaxed")


@triton.jit
def _expand_bgmv_kernel(h_ptr, b_ptr, y_ptr, slots_ptr, N, R, stride_ht, stride_bs, stride_yt,
                        BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    t, pid_n = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rr = tl.arange(0, BLOCK_R)
        h = tl.load(h_ptr + t.to(tl.int64) * stride_ht + rr, mask=rr < R, other=0.0)
        b = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + rn[:, None] * R + rr[None, :],
                    mask=(rn[:, None] < N) & (rr[None, :] < R), other=0.0)
        delta = tl.sum(b.to(tl.float32) * h[None, :], axis=1)
        y_ptrs = y_ptr + t.to(tl.int64) * stride_yt + rn
        y = tl.load(y_ptrs, mask=rn < N, other=0.0).to(tl.float32)
        tl.store(y_ptrs, (y + delta).to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _segment(seg_ptr, stride_seg):
    seg = tl.program_id(0)
    return tl.load(seg_ptr + seg), tl.load(seg_ptr + stride_seg + seg), tl.load(seg_ptr + 2 * stride_seg + seg)


@triton.jit
def _shrink_sgmv_kernel(x_ptr, a_ptr, h_ptr, seg_ptr, K, C, stride_xt, stride_as, stride_ht, stride_seg,
                        BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    start, length, slot = _segment(seg_ptr, stride_seg)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    if tl.program_id(1) * BLOCK_M < length:
        rc = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        rk = tl.arange(0, BLOCK_K)
        rows = (start + rm).to(tl.int64)
        x_ptrs = x_ptr + rows[:, None] * stride_xt + rk[None, :]
        a_ptrs = a_ptr + slot.to(tl.int64) * stride_as + rc[None, :] * K + rk[:, None]  # [BLOCK_K, BLOCK_C]
        acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            x = tl.load(x_ptrs + k, mask=(rm[:, None] < length) & (k + rk[None, :] < K), other=0.0)
            a = tl.load(a_ptrs + k, mask=(rc[None, :] < C) & (k + rk[:, None] < K), other=0.0)
            acc = tl.dot(x, a, acc, input_precision=DOT_PRECISION)
        tl.store(h_ptr + rows[:, None] * stride_ht + rc[None, :], acc, mask=(rm[:, None] < length) & (rc[None, :] < C))


@triton.jit
def _expand_sgmv_kernel(h_ptr, b_ptr, y_ptr, seg_ptr, N, R, stride_ht, stride_bs, stride_yt, stride_seg,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    start, length, slot = _segment(seg_ptr, stride_seg)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    if tl.program_id(1) * BLOCK_M < length:
        rn = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        rr = tl.arange(0, BLOCK_R)
        rows = (start + rm).to(tl.int64)
        row_ok = rm[:, None] < length
        h = tl.load(h_ptr + rows[:, None] * stride_ht + rr[None, :], mask=row_ok & (rr[None, :] < R), other=0.0)
        b = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + rn[None, :] * R + rr[:, None],
                    mask=(rn[None, :] < N) & (rr[:, None] < R), other=0.0)  # [BLOCK_R, BLOCK_N]
        # h goes to the weights' dtype for the tensor cores, as Punica does (float32 stays float32).
        delta = tl.dot(h.to(b.dtype), b, input_precision=DOT_PRECISION)
        y_ptrs = y_ptr + rows[:, None] * stride_yt + rn[None, :]
        mask = row_ok & (rn[None, :] < N)
        y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptrs, (y + delta).to(y_ptr.dtype.element_ty), mask=mask)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _rank_block(rank: int) -> int:
    return max(16, triton.next_power_of_2(rank))


def shrink_bgmv(x: torch.Tensor, lora_a: torch.Tensor, token_slots: torch.Tensor,
                block_c: int = 32, block_k: int = 128, split_k: int | None = None) -> torch.Tensor:
    """h [T, shards * R] float32 = x[t] @ lora_a[slot_t].view(-1, K).T per token (rows of tokens
    without a slot undefined). Split over K (float32 atomics into a zeroed buffer) where the
    tokens alone give too few programs for the SMs: a function of the shapes only, so a graph
    captured for T tokens stays right."""
    (t, k), c = x.shape, lora_a.shape[1] * lora_a.shape[2]
    programs = t * triton.cdiv(c, block_c)
    if split_k is None:
        split_k = min(triton.cdiv(2 * _num_sms(x.device), programs), triton.cdiv(k, block_k)) if programs else 1
    h = (torch.zeros if split_k > 1 else torch.empty)(t, c, dtype=torch.float32, device=x.device)
    if t:
        _shrink_bgmv_kernel[(t, triton.cdiv(c, block_c), split_k)](
            x, lora_a, h, token_slots, k, c, x.stride(0), lora_a.stride(0), h.stride(0),
            BLOCK_C=block_c, BLOCK_K=block_k, SPLIT_K=split_k)
    return h


def expand_bgmv(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, token_slots: torch.Tensor,
                block_n: int = 64) -> None:
    """y[t] += h[t] @ lora_b[slot_t].T per token with a slot: y [T, N] (one shard, a view of the
    layer's output), h [T, R] float32, lora_b [slots, N, R] with rows R contiguous."""
    (t, n), rank = y.shape, lora_b.shape[2]
    assert lora_b.stride(1) == rank and lora_b.stride(2) == 1 and y.stride(1) == 1 and h.stride(1) == 1
    if t:
        _expand_bgmv_kernel[(t, triton.cdiv(n, block_n))](
            h, lora_b, y, token_slots, n, rank, h.stride(0), lora_b.stride(0), y.stride(0),
            BLOCK_N=block_n, BLOCK_R=_rank_block(rank))


def shrink_sgmv(x: torch.Tensor, lora_a: torch.Tensor, segments: torch.Tensor, max_length: int,
                block_m: int = 64, block_c: int = 64, block_k: int = 64) -> torch.Tensor:
    """h [T, shards * R] float32 = x[rows] @ lora_a[slot].view(-1, K).T per segment (segments:
    int32 [3, S], starts, lengths, slots; rows outside them undefined)."""
    (t, k), c = x.shape, lora_a.shape[1] * lora_a.shape[2]
    h = torch.empty(t, c, dtype=torch.float32, device=x.device)
    block_c = min(block_c, max(16, triton.next_power_of_2(c)))
    if segments.shape[1] and max_length:
        grid = (segments.shape[1], triton.cdiv(max_length, block_m), triton.cdiv(c, block_c))
        _shrink_sgmv_kernel[grid](x, lora_a, h, segments, k, c, x.stride(0), lora_a.stride(0), h.stride(0),
                                  segments.stride(0), BLOCK_M=block_m, BLOCK_C=block_c, BLOCK_K=block_k,
                                  DOT_PRECISION=_dot_precision(x.dtype))
    return h


def expand_sgmv(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, segments: torch.Tensor,
                max_length: int, block_m: int = 64, block_n: int = 64) -> None:
    """y[rows] += h[rows] @ lora_b[slot].T per segment; y [T, N] one shard, h [T, R] float32."""
    (t, n), rank = y.shape, lora_b.shape[2]
    assert lora_b.stride(1) == rank and lora_b.stride(2) == 1 and y.stride(1) == 1 and h.stride(1) == 1
    if segments.shape[1] and max_length:
        grid = (segments.shape[1], triton.cdiv(max_length, block_m), triton.cdiv(n, block_n))
        _expand_sgmv_kernel[grid](h, lora_b, y, segments, n, rank, h.stride(0), lora_b.stride(0), y.stride(0),
                                  segments.stride(0), BLOCK_M=block_m, BLOCK_N=block_n,
                                  BLOCK_R=_rank_block(rank), DOT_PRECISION=_dot_precision(y.dtype))


def _shards(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, shard_sizes: tuple[int, ...]):
    """(y's columns, h's rank block, lora_b's rows) of each shard."""
    rank, off = lora_b.shape[2], 0
    for i, n in enumerate(shard_sizes):
        yield y[:, off:off + n], h[:, i * rank:(i + 1) * rank], lora_b[:, off:off + n]
        off += n


def add_lora_bgmv(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                  shard_sizes: tuple[int, ...], token_slots: torch.Tensor) -> None:
    """gdserve.kernels.lora.add_lora (validated there) by token: reads only device tensors."""
    h = shrink_bgmv(x, lora_a, token_slots)
    for y_shard, h_shard, b_shard in _shards(y, h, lora_b, shard_sizes):
        expand_bgmv(y_shard, h_shard, b_shard, token_slots)


def add_lora_sgmv(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                  shard_sizes: tuple[int, ...], segments: torch.Tensor, max_length: int) -> None:
    """gdserve.kernels.lora.add_lora by segment: segments int32 [3, S] (starts, lengths, slots of
    runs of tokens with one adapter), max_length their longest (the grid)."""
    h = shrink_sgmv(x, lora_a, segments, max_length)
    for y_shard, h_shard, b_shard in _shards(y, h, lora_b, shard_sizes):
        expand_sgmv(y_shard, h_shard, b_shard, segments, max_length)
