"""Split over K in one kernel: a GEMM's programs that share an output tile add their float32
partial sums into a workspace, and the last of them stores the tile in the output's dtype and
leaves the workspace zero for the next GEMM (no memset before or cast after)."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def store_tile(out_ptrs, acc, mask, sums_ptrs, lock_ptr, SPLIT_K: tl.constexpr):
    """A program's float32 sums, stored in the output's dtype. Split over K, each program adds its
    share into the float32 workspace (sums_ptrs, split_k_buffers) and counts itself in at
    lock_ptr; the last of the tile's programs takes the sums, stores them and leaves the sums and
    the count zero for the next GEMM: one kernel, no memset or cast around it."""
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptrs.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(sums_ptrs, acc, mask=mask, sem="relaxed")
        tl.debug_barrier()  # every thread's share is in before the count says so
        if tl.atomic_add(lock_ptr, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.load(sums_ptrs, mask=mask, other=0.0, cache_modifier=".cg")  # from L2, where the adds went
            tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=mask)
            tl.store(sums_ptrs, tl.zeros_like(acc), mask=mask)
            tl.store(lock_ptr, 0)


@dataclass
class SplitKWorkspace:
    sums: torch.Tensor  # float32, all zero between GEMMs
    locks: torch.Tensor  # int32 a tile, all zero between GEMMs


# Grown, never freed: a captured CUDA graph keeps the addresses of those it ran with.
_WORKSPACES: dict[torch.device, list[SplitKWorkspace]] = {}


def split_k_buffers(out: torch.Tensor, tiles: int, split_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums and locks store_tile takes for a GEMM into out [M, N] in this many tiles: the
    device's workspace where split over K (GEMMs on one device share it, so they run one at a
    time, on one stream, as the engine's do); out itself, unused, where not."""
    if split_k == 1:
        return out, out
    (M, N), device = out.shape, out.device
    spaces = _WORKSPACES.setdefault(device, [])
    if not spaces or spaces[-1].sums.numel() < M * N or spaces[-1].locks.numel() < tiles:
        sums = max(M * N, spaces[-1].sums.numel() if spaces else 0)
        locks = max(tiles, spaces[-1].locks.numel() if spaces else 0)
        spaces.append(SplitKWorkspace(torch.zeros(sums, dtype=torch.float32, device=device),
                                      torch.zeros(locks, dtype=torch.int32, device=device)))
    return spaces[-1].sums, spaces[-1].locks
