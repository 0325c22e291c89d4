"""Owns the model and its KV cache; turns a scheduled batch into one forward pass."""
import torch

from gdserve.engine.cuda_graph import CudaGraphRunner
from gdserve.engine.request import Sequence
from gdserve.kernels.triton import use_triton
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
        self.cuda_graphs: CudaGraphRunner | None = None

    def capture_cuda_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        """Decode steps of up to max_num_seqs sequences replay CUDA graphs from now on (CUDA with
        the Triton KV write and attention, which take the graphs' padding rows)."""
        if not (use_triton(self.kv_cache, "kv_cache") and use_triton(self.kv_cache, "paged_attention")):
            return
        self.cuda_graphs = CudaGraphRunner(self.model, max_num_seqs, max_model_len, self.block_size, self.device)
        self.cuda_graphs.capture()

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_new_tokens: list[int], sample_rows: list[int]) -> torch.Tensor:
        """Run one forward over the batch and return the logits [len(sample_rows), V] of the
        last new token of each sequence in sample_rows (indices into seqs)."""
        input_ids, positions, meta, last_index = self._prepare(seqs, num_new_tokens)
        graphs = self.cuda_graphs
        if graphs is not None and meta.num_decodes == len(seqs) <= graphs.max_batch:
            hidden = graphs.run(input_ids, positions, meta)
        else:
            hidden = self.model(input_ids, positions, meta)
        return self.model.compute_logits(hidden[last_index[sample_rows]])

    @torch.inference_mode()
    def embed(self, token_ids: list[int], block_table: list[int]) -> torch.Tensor:
        """Prefill token_ids into the given (scratch) blocks in one forward; return the mean of the
        final-normed hidden states, L2-normalized, as float32 [hidden]."""
        positions, meta = AttentionMetadata.build([block_table], [0], [len(token_ids)],
                                                  self.block_size, self.device)
        input_ids = torch.tensor(token_ids, dtype=torch.int64).to(self.device)
        hidden = self.model(input_ids, positions, meta).float()  # [T, hidden]
        return torch.nn.functional.normalize(hidden.mean(0), dim=0).cpu()

    def _prepare(self, seqs: list[Sequence], num_new_tokens: list[int]):
        # Attention wants single-token sequences first (sorted by context length, which lets it
        # group them with little padding); last_index maps back to the caller's order.
        order = sorted(range(len(seqs)), key=lambda i: (num_new_tokens[i] != 1, seqs[i].num_computed_tokens))
        seqs = [seqs[i] for i in order]
        num_new_tokens = [num_new_tokens[i] for i in order]
        starts = [s.num_computed_tokens for s in seqs]
        input_ids = [t for s, start, n in zip(seqs, starts, num_new_tokens) for t in s.token_ids[start:start + n]]
        positions, meta = AttentionMetadata.build([s.block_table for s in seqs], starts, num_new_tokens,
                                                  self.block_size, self.device)
        last_index = torch.empty(len(order), dtype=torch.int64)
        last_index[order] = torch.tensor(num_new_tokens).cumsum(0) - 1
        input_ids = torch.tensor(input_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        return input_ids, positions, meta, last_index.to(self.device)
