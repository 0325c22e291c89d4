"""Reading a checkpoint tensor, or only a slice of it: a torch.Tensor, or a safetensors slice
(`safe_open(...).get_slice(name)`) whose rows or columns are read from the file on demand, so a
tensor-parallel rank reads only its own shard."""
from typing import Any, Protocol

import torch


class LazySlice(Protocol):
    def get_shape(self) -> list[int]: ...
    def __getitem__(self, index: Any) -> torch.Tensor: ...


CheckpointTensor = torch.Tensor | LazySlice


def checkpoint_shape(tensor: CheckpointTensor) -> tuple[int, ...]:
    return tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else tuple(tensor.get_shape())


def read(tensor: CheckpointTensor) -> torch.Tensor:
    return tensor if isinstance(tensor, torch.Tensor) else tensor[:]


def read_narrow(tensor: CheckpointTensor, dim: int, start: int, length: int) -> torch.Tensor:
    """tensor.narrow(dim, start, length), reading only that part of a lazy slice."""
    if isinstance(tensor, torch.Tensor):
        return tensor.narrow(dim, start, length)
    return tensor[(slice(None),) * dim + (slice(start, start + length),)]


def check_shape(tensor: CheckpointTensor, expected: tuple[int, ...]) -> None:
    shape = checkpoint_shape(tensor)
    if shape != tuple(expected):
        raise ValueError(f"checkpoint shape {shape}, model expects {tuple(expected)}")


@torch.no_grad()
def default_weight_loader(param: torch.Tensor, tensor: CheckpointTensor) -> None:
    """A parameter every rank holds whole (norms, unsharded layers)."""
    check_shape(tensor, param.shape)
    param.copy_(read(tensor))
