"""The token embedding and the LM head split by vocabulary rows across the ranks. Each rank holds
ceil(vocab / tp) rows (the last one's tail zero padding): the embedding looks up the ids in its
rows, zeroes the others and all-reduces; the LM head's logits are gathered to rank 0 alone, the
one rank that samples."""
import torch
import torch.nn.functional as F
from torch import nn

from gdserve.distributed.communication_op import tensor_model_parallel_all_reduce, tensor_model_parallel_gather
from gdserve.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                get_tensor_model_parallel_world_size)
from gdserve.layers.checkpoint import CheckpointTensor, check_shape, read, read_narrow


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.rows_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = get_tensor_model_parallel_rank() * self.rows_per_rank
        self.num_real_rows = max(0, min(self.rows_per_rank, num_embeddings - self.vocab_start))
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, embedding_dim))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.rows_per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0)
        return tensor_model_parallel_all_reduce(out)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[N, hidden] -> [N, vocab] in the weight's dtype on rank 0; None on the other ranks.
        Not widened to float32: the sampler makes that copy only where it needs one."""
        logits = tensor_model_parallel_gather(F.linear(hidden, self.weight))
        if logits is None:
            return None
        if logits.shape[-1] != self.num_embeddings:
            logits = logits[:, :self.num_embeddings]
        return logits

    @torch.no_grad()
    def weight_loader(self, param: torch.Tensor, tensor: CheckpointTensor, index: int = 0) -> None:
        check_shape(tensor, (self.num_embeddings, self.embedding_dim))
        if self.tp_size == 1:
            param.copy_(read(tensor))
            return
        param[:self.num_real_rows].copy_(read_narrow(tensor, 0, self.vocab_start, self.num_real_rows))
        param[self.num_real_rows:].zero_()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows_per_rank={self.rows_per_rank}"


class ParallelLMHead(VocabParallelEmbedding):
    """An untied LM head: the same split as the embedding, used only through compute_logits."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("an LM head computes logits (compute_logits), it does not embed")
