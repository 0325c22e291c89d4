"""Decode steps replayed from CUDA graphs: one graph per batch-size bucket, captured once at startup
over static input buffers, so a decode step costs a few copies and one launch instead of hundreds.
A decode step is one whose tokens are all decode rows (decodes, and the tokens of short chunks
such as forced text: layers/attention.py), one row a token.

A graph fixes every host-side value the forward reads. Attention's are the decode batch's shape and
its longest context (which picks the split-K layout): graphs are captured with every context at
max_model_len, and the kernels bound each sequence by its real length from `seq_lens` on the device.
Rows past the real batch are padding: KV slot -1 (nothing written), context length 1, output unused.
With LoRA, the graphs read a static token -> adapter slot mapping too, and its tokens grouped by
slot on the device: each step overwrites both in place (LoRAMapping.copy_).
"""
import torch

from gdserve.kernels.lora import LoRAMapping
from gdserve.layers.attention import AttentionMetadata
from gdserve.lora.layers import LoRAContext


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Captured batch sizes: 1, 2, 4, 8, every multiple of 16 up to 256, then of 32 (past 256 rows
    the padding stays under 11% of a step), and max_num_seqs."""
    sizes = [1, 2, 4, 8, *range(16, 257, 16), *range(288, max_num_seqs + 32, 32)]
    return sorted({min(s, max_num_seqs) for s in sizes})


class CudaGraphRunner:
    def __init__(self, model: torch.nn.Module, max_num_seqs: int, max_model_len: int, block_size: int,
                 device: torch.device, lora_context: LoRAContext | None = None):
        self.model = model
        self.lora_context = lora_context
        self.max_model_len = max_model_len
        self.buckets = batch_buckets(max_num_seqs)
        n, max_blocks = self.buckets[-1], -(-max_model_len // block_size)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(n, max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.lora_mapping = LoRAMapping.static(n, lora_context.num_slots, device) if lora_context is not None else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def _meta(self, n: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slot_mapping[:n], block_tables=self.block_tables[:n],
                                 query_lens=[1] * n, seq_lens=[self.max_model_len] * n,
                                 seq_lens_tensor=self.seq_lens[:n], num_decodes=n,
                                 query_start_loc=self.query_start_loc[:n + 1])

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest bucket first, all sharing one memory pool (the smaller ones fit in its blocks)."""
        pool = None
        for n in reversed(self.buckets):
            args = (self.input_ids[:n], self.positions[:n], self._meta(n))
            if self.lora_context is not None:
                self.lora_context.mapping = self.lora_mapping.narrow(n)
            self.model(*args)  # warm-up: Triton compiles and autotunes outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[n] = self.model(*args)
            pool = graph.pool()
            self.graphs[n] = graph
        torch.cuda.synchronize()
        if self.lora_context is not None:
            self.lora_context.mapping = None

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """A step of at most max_batch decode rows -> hidden states [rows, hidden]."""
        num_seqs = input_ids.shape[0]
        n = next(b for b in self.buckets if b >= num_seqs)
        width = meta.block_tables.shape[1]
        self.input_ids[:num_seqs].copy_(input_ids)
        self.positions[:num_seqs].copy_(positions)
        self.slot_mapping[:num_seqs].copy_(meta.slot_mapping)
        self.slot_mapping[num_seqs:n].fill_(-1)
        self.block_tables[:num_seqs, :width].copy_(meta.block_tables)
        self.seq_lens[:num_seqs].copy_(meta.seq_lens_tensor)
        self.seq_lens[num_seqs:n].fill_(1)
        if self.lora_mapping is not None:
            self.lora_mapping.copy_(self.lora_context.mapping)
        self.graphs[n].replay()
        return self.outputs[n][:num_seqs]
