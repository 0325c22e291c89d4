import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gdserve.kernels import paged_attention, write_kv_cache
from gdserve.kernels.fp8_attention import rotation
from gdserve.utils import to_device

# Output tokens added at most this many at once (forced text) attend as one decode row per token:
# the decode kernel takes them beside the decodes, and a step made of them alone replays a CUDA
# graph (engine/model_runner.py picks those sequences). Longer chunks go to the prefill kernel.
SHORT_CHUNK = 16


@dataclass
class AttentionMetadata:
    """What attention needs to know about one step's flat token layout, built by the ModelRunner.
    Its rows are what attention iterates: decode rows first (query_len 1: a decode, or one token
    of a short chunk, seeing the keys up to its own position), then prefill chunks."""
    slot_mapping: torch.Tensor   # [T] int64: KV slot (block * block_size + offset) of each new token
    block_tables: torch.Tensor   # [R, max_blocks] int32: each row's sequence's
    query_lens: list[int]        # [R] query tokens per row
    seq_lens: list[int]          # [R] keys each row sees: its sequence's context up to its last token
    seq_lens_tensor: torch.Tensor  # [R] int32, the same on the device
    num_decodes: int             # the first num_decodes rows have query_len == 1
    query_start_loc: torch.Tensor | None = None  # [R + 1] int32: cumulative query_lens (for CUDA)

    @classmethod
    def build(cls, block_tables: list[list[int]], starts: list[int], query_lens: list[int],
              block_size: int, device: torch.device | str = "cpu", num_short: int | None = None
              ) -> tuple[torch.Tensor, "AttentionMetadata"]:
        """Sequence i adds tokens at positions starts[i] .. starts[i] + query_lens[i] - 1; each
        token of the first num_short sequences becomes a decode row (None: the leading sequences
        that add one token). Returns (positions [T], metadata)."""
        q_lens = np.asarray(query_lens, dtype=np.int64)
        seq_lens = np.asarray(starts, dtype=np.int64) + q_lens
        query_start_loc = np.zeros(len(q_lens) + 1, dtype=np.int64)
        np.cumsum(q_lens, out=query_start_loc[1:])
        seq_of_token = np.repeat(np.arange(len(q_lens)), q_lens)
        # token t of sequence i sits at starts[i] + (t - query_start_loc[i])
        positions = np.arange(query_start_loc[-1]) + np.repeat(seq_lens - q_lens - query_start_loc[:-1], q_lens)
        tables = _padded(block_tables)
        slots = tables[seq_of_token, positions // block_size] * block_size + positions % block_size
        if num_short is None:
            num_short = int(np.argmax(q_lens != 1)) if (q_lens != 1).any() else len(q_lens)
        num_decodes = int(query_start_loc[num_short])  # the short sequences' tokens, a row each
        row_seq = np.concatenate([seq_of_token[:num_decodes], np.arange(num_short, len(q_lens))])
        row_q_lens = np.concatenate([np.ones(num_decodes, dtype=np.int64), q_lens[num_short:]])
        row_seq_lens = np.concatenate([positions[:num_decodes] + 1, seq_lens[num_short:]])
        row_start_loc = np.concatenate([np.arange(num_decodes), query_start_loc[num_short:]])
        meta = cls(slot_mapping=to_device(slots, torch.int64, device),
                   block_tables=to_device(tables[row_seq], torch.int32, device),
                   query_lens=row_q_lens.tolist(), seq_lens=row_seq_lens.tolist(),
                   seq_lens_tensor=to_device(row_seq_lens, torch.int32, device), num_decodes=num_decodes,
                   query_start_loc=to_device(row_start_loc, torch.int32, device))
        return to_device(positions, torch.int64, device), meta


def _padded(block_tables: list[list[int]]) -> np.ndarray:
    """[S, max_blocks] int64, zero-padded: one flat fill instead of a row per sequence."""
    lens = np.fromiter(map(len, block_tables), dtype=np.int64, count=len(block_tables))
    flat = np.fromiter(itertools.chain.from_iterable(block_tables), dtype=np.int64, count=int(lens.sum()))
    tables = np.zeros((len(block_tables), int(lens.max(initial=0))), dtype=np.int64)
    starts = np.repeat(np.cumsum(lens) - lens, lens)
    tables[np.repeat(np.arange(len(lens)), lens), np.arange(len(flat)) - starts] = flat
    return tables


class Attention(nn.Module):
    """Paged attention over this layer's slice of the KV cache. The ModelRunner binds
    k_cache / v_cache ([num_blocks, block_size, KVH, D]) after allocating the cache. With
    `rotation` set (fp8_math) the model turns queries and keys by it before they come here (the
    rotary embedding's pass does it: kernels/rotary.py), and the cache holds the turned keys."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.register_buffer("rotation", None, persistent=False)  # [D, D], set by use_fp8_attention
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    @property
    def fp8_math(self) -> bool:
        """Prefill chunks' dots in fp8 over an e4m3 cache, queries and keys turned by `rotation`."""
        return self.rotation is not None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KVH, D] -> [T, H * D]"""
        write_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        out = paged_attention(q, self.k_cache, self.v_cache, meta.block_tables, meta.seq_lens_tensor,
                              meta.query_lens, meta.seq_lens, meta.num_decodes, self.scale,
                              meta.query_start_loc, self.fp8_math)
        return out.flatten(1)


def use_fp8_attention(model: nn.Module, dtype: torch.dtype) -> None:
    """Every attention layer of the model runs its prefill chunks' dots in fp8, its queries and
    keys (of dtype) turned by kernels/fp8_attention.py's rotation; the KV cache must be e4m3."""
    device = next(model.parameters()).device
    for module in model.modules():
        if isinstance(module, Attention):
            module.rotation = rotation(module.head_dim).to(device, dtype)
