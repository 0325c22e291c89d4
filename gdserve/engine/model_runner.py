"""Owns the model and its KV cache; turns a scheduled batch into one forward pass."""
import torch

from gdserve.engine.request import Sequence
from gdserve.layers.attention import Attention, AttentionMetadata
from gdserve.models.config import ModelConfig


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * elem


class ModelRunner:
    def __init__(self, model: torch.nn.Module, config: ModelConfig, num_blocks: int, block_size: int,
                 device: torch.device, dtype: torch.dtype):
        self.model = model
        self.block_size = block_size
        self.device = device
        shape = (2, config.num_hidden_layers, num_blocks, block_size,
                 config.num_key_value_heads, config.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        attns = [m for m in model.modules() if isinstance(m, Attention)]
        for i, attn in enumerate(attns):
            attn.k_cache, attn.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_new_tokens: list[int], sample_rows: list[int]) -> torch.Tensor:
        """Run one forward over the batch and return the logits [len(sample_rows), V] of the
        last new token of each sequence in sample_rows (indices into seqs)."""
        input_ids, positions, meta, last_index = self._prepare(seqs, num_new_tokens)
        hidden = self.model(input_ids, positions, meta)
        return self.model.compute_logits(hidden[last_index[sample_rows]])

    def _prepare(self, seqs: list[Sequence], num_new_tokens: list[int]):
        # Attention wants single-token sequences first; last_index maps back to the caller's order.
        order = sorted(range(len(seqs)), key=lambda i: num_new_tokens[i] != 1)
        seqs = [seqs[i] for i in order]
        num_new_tokens = [num_new_tokens[i] for i in order]
        input_ids, positions, slots, seq_lens = [], [], [], []
        for seq, n in zip(seqs, num_new_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(self._slots(seq.block_table, start, end))
            seq_lens.append(end)
        max_blocks = max(len(s.block_table) for s in seqs)
        block_tables = [s.block_table + [0] * (max_blocks - len(s.block_table)) for s in seqs]
        num_decodes = sum(1 for n in num_new_tokens if n == 1)
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots, torch.int64),
            block_tables=self._tensor(block_tables, torch.int32),
            query_lens=list(num_new_tokens), seq_lens=seq_lens, num_decodes=num_decodes)
        last_index = torch.empty(len(order), dtype=torch.int64)
        last_index[order] = torch.tensor(num_new_tokens).cumsum(0) - 1
        return (self._tensor(input_ids, torch.int64), self._tensor(positions, torch.int64), meta,
                last_index.to(self.device))

    def _slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, end)]

    def _tensor(self, data, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype).to(self.device, non_blocking=True)
