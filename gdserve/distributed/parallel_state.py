"""This process's place in the tensor-parallel group: its rank, the group's size, and the
torch.distributed process group behind them (NCCL on CUDA, gloo on the CPU)."""
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallelState:
    rank: int = 0
    size: int = 1


_state = TensorParallelState()


def get_tensor_model_parallel_rank() -> int:
    return _state.rank


def get_tensor_model_parallel_world_size() -> int:
    return _state.size


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_tensor_parallel(rank: int, size: int, init_method: str, device: torch.device,
                         timeout: timedelta) -> None:
    """Join the group of `size` ranks at init_method (a tcp:// address rank 0 serves). Layers
    built after this shard themselves for `rank`."""
    global _state
    if size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:  # the group is on one machine: gloo over loopback, whatever the hostname resolves to
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=size,
                                timeout=timeout, device_id=device if device.type == "cuda" else None)
    _state = TensorParallelState(rank, size)


def destroy_tensor_parallel() -> None:
    global _state
    if dist.is_initialized():
        dist.destroy_process_group()
    _state = TensorParallelState()


def abort_tensor_parallel() -> None:
    """Make collectives blocked on a rank that is gone raise instead of waiting for their timeout
    (called from another thread than the one that waits)."""
    if dist.is_initialized():
        dist.distributed_c10d._abort_process_group()
