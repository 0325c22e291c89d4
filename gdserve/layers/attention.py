import itertools
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
    seq_lens_tensor: torch.Tensor  # [S] int32, the same on the device
    num_decodes: int             # the first num_decodes sequences have query_len == 1
    query_start_loc: torch.Tensor | None = None  # [S + 1] int32: cumulative query_lens (for CUDA)

    @classmethod
    def build(cls, block_tables: list[list[int]], starts: list[int], query_lens: list[int],
              block_size: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, "AttentionMetadata"]:
        """Sequence i adds tokens at positions starts[i] .. starts[i] + query_lens[i] - 1; sequences
        with query_len 1 must come first. Returns (positions [T], metadata)."""
        positions, slots = [], []
        for table, start, q_len in zip(block_tables, starts, query_lens):
            for p in range(start, start + q_len):
                positions.append(p)
                slots.append(table[p // block_size] * block_size + p % block_size)
        width = max(map(len, block_tables))
        padded = [t + [0] * (width - len(t)) for t in block_tables]
        seq_lens = [s + q for s, q in zip(starts, query_lens)]
        num_decodes = next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))
        query_start_loc = [0, *itertools.accumulate(query_lens)]
        meta = cls(slot_mapping=_to(slots, torch.int64, device), block_tables=_to(padded, torch.int32, device),
                   query_lens=list(query_lens), seq_lens=seq_lens,
                   seq_lens_tensor=_to(seq_lens, torch.int32, device), num_decodes=num_decodes,
                   query_start_loc=_to(query_start_loc, torch.int32, device))
        return _to(positions, torch.int64, device), meta


def _to(data: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype).to(device, non_blocking=True)


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
        out = paged_attention(q, self.k_cache, self.v_cache, meta.block_tables, meta.seq_lens_tensor,
                              meta.query_lens, meta.seq_lens, meta.num_decodes, self.scale,
                              meta.query_start_loc)
        return out.flatten(1)
