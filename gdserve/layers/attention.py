from dataclasses import dataclass

import torch
from torch import nn

from gdserve.kernels import paged_attention, write_kv_cache


@dataclass
class AttentionMetadata:
    """What attention needs to know about one step's flat token layout, built by the ModelRunner.
    Sequences are ordered decodes first (query_len 1), then prefill chunks."""
    slot_mapping: torch.Tensor   # [T] int64: KV slot (block * block_size + offset) of each new token
    block_tables: torch.Tensor   # [S, max_blocks] int32
    query_lens: list[int]        # [S] new tokens per sequence this step
    seq_lens: list[int]          # [S] context length after this step (computed + new)
    num_decodes: int             # the first num_decodes sequences have query_len == 1


class Attention(nn.Module):
    """Paged attention over this layer's slice of the KV cache. The ModelRunner binds
    k_cache / v_cache ([num_blocks, block_size, KVH, D]) after allocating the cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KVH, D] -> [T, H * D]"""
        write_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        out = paged_attention(q, self.k_cache, self.v_cache, meta.block_tables, meta.query_lens,
                              meta.seq_lens, meta.num_decodes, self.scale)
        return out.flatten(1)
