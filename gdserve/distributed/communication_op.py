"""The collectives the tensor-parallel layers run in the forward. Each is the identity on a group
of one rank, so the single-device path runs no collective."""
import torch
import torch.distributed as dist

from gdserve.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                get_tensor_model_parallel_world_size)


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over the ranks, on every rank (in place)."""
    if get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(x)
    return x


def tensor_model_parallel_gather(x: torch.Tensor) -> torch.Tensor | None:
    """The ranks' x concatenated along the last dim, in rank order, on rank 0; None elsewhere."""
    size = get_tensor_model_parallel_world_size()
    if size == 1:
        return x
    x = x.contiguous()
    if get_tensor_model_parallel_rank() != 0:
        dist.gather(x, None, dst=0)
        return None
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.gather(x, parts, dst=0)
    return torch.cat(parts, dim=-1)


def tensor_model_parallel_broadcast(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's x on every rank (in place)."""
    if get_tensor_model_parallel_world_size() > 1:
        dist.broadcast(x, src=0)
    return x
