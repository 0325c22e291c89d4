"""Tensor-parallel linear layers (Megatron-LM's split, vLLM's names). On a group of one rank each
is a plain nn.Linear holding the whole weight.

A column-parallel layer splits its output features across the ranks: each rank computes its slice
of the output, with no communication. A row-parallel layer splits its input features: each rank
multiplies its slice of the input (the column-parallel layer's output, as it is) and one
all-reduce sums the partial products. An attention block and an MLP block thus run one
all-reduce each."""
import torch
from torch import nn

from gdserve.distributed.communication_op import tensor_model_parallel_all_reduce
from gdserve.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                get_tensor_model_parallel_world_size)
from gdserve.layers.checkpoint import CheckpointTensor, check_shape, read, read_narrow


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"tensor_parallel_size {denominator} does not divide {what} ({numerator})")
    return numerator // denominator


class ColumnParallelLinear(nn.Linear):
    """Projections of one input stacked on the output dim (one GEMM), each split evenly across
    the ranks: this rank holds, for projection i, rows [block_i * size_i, (block_i + 1) * size_i)
    of its checkpoint weight, where size_i = shard_sizes[i] and block_i = shard_blocks[i]."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool):
        size, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        shard_sizes = [divide(n, size, "an output size of a column-parallel layer") for n in output_sizes]
        self._init(in_features, output_sizes, shard_sizes, [rank] * len(output_sizes), bias)

    def _init(self, in_features: int, output_sizes: list[int], shard_sizes: list[int],
              shard_blocks: list[int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.output_sizes = list(output_sizes)   # each projection's whole size, as in the checkpoint
        self.shard_sizes = list(shard_sizes)     # each projection's rows on this rank
        self.shard_blocks = list(shard_blocks)

    def shard(self, tensor: torch.Tensor, index: int) -> torch.Tensor:
        """The rows of this layer's weight or bias that belong to projection `index`."""
        return tensor.narrow(0, sum(self.shard_sizes[:index]), self.shard_sizes[index])

    @torch.no_grad()
    def weight_loader(self, param: torch.Tensor, tensor: CheckpointTensor, index: int = 0) -> None:
        """Copy this rank's rows of projection `index`'s checkpoint weight (or bias) in."""
        check_shape(tensor, (self.output_sizes[index], *param.shape[1:]))
        size = self.shard_sizes[index]
        rows = read(tensor) if size == self.output_sizes[index] else \
            read_narrow(tensor, 0, self.shard_blocks[index] * size, size)
        self.shard(param, index).copy_(rows)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v stacked, split by heads: each rank holds num_heads / tp query heads and
    num_kv_heads / tp KV heads, or, with fewer KV heads than ranks, one KV head shared by
    tp / num_kv_heads consecutive ranks (replicated)."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool):
        size, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.num_heads = divide(num_heads, size, "the number of attention heads")
        if num_kv_heads >= size:
            self.num_kv_heads, kv_block = divide(num_kv_heads, size, "the number of KV heads"), rank
        else:
            if size % num_kv_heads:
                raise ValueError(f"tensor_parallel_size {size} is neither a divisor nor a multiple of the "
                                 f"number of KV heads ({num_kv_heads})")
            self.num_kv_heads, kv_block = 1, rank // (size // num_kv_heads)
        q, kv = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self._init(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim],
                   [q, kv, kv], [rank, kv_block, kv_block], bias)


class RowParallelLinear(nn.Linear):
    """y = x W^T + b with W's input features split across the ranks: each rank's x is its slice
    (a column-parallel layer's output) and one all-reduce sums the partial products. The bias is
    rank 0's alone (zeros elsewhere), so the sum adds it once."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        self.tp_rank = get_tensor_model_parallel_rank()
        super().__init__(divide(in_features, get_tensor_model_parallel_world_size(),
                                "the input size of a row-parallel layer"), out_features, bias=bias)
        self.full_in_features = in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor_model_parallel_all_reduce(super().forward(x))

    @torch.no_grad()
    def weight_loader(self, param: torch.Tensor, tensor: CheckpointTensor, index: int = 0) -> None:
        if param.dim() == 1:  # the bias
            check_shape(tensor, param.shape)
            if self.tp_rank == 0:
                param.copy_(read(tensor))
            else:
                param.zero_()
            return
        check_shape(tensor, (self.out_features, self.full_in_features))
        if self.in_features == self.full_in_features:
            param.copy_(read(tensor))
        else:
            param.copy_(read_narrow(tensor, 1, self.tp_rank * self.in_features, self.in_features))
