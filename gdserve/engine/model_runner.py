"""Owns the model and its KV cache; turns a scheduled batch into one forward pass."""
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gdserve.distributed.communication_op import tensor_model_parallel_broadcast
from gdserve.distributed.parallel_state import get_tensor_model_parallel_world_size
from gdserve.engine.cuda_graph import CudaGraphRunner
from gdserve.engine.request import PLACEHOLDER, Sequence
from gdserve.kernels.lora import LoRAMapping, add_lora
from gdserve.kernels.triton import use_triton
from gdserve.layers.attention import SHORT_CHUNK, Attention, AttentionMetadata
from gdserve.layers.packed_linear import PackedLinear
from gdserve.layers.quantization import Fp8Linear
from gdserve.lora.layers import LoRAContext, LoRALinear
from gdserve.models.config import ModelConfig
from gdserve.utils import to_device


def gemm_warm_up_rows(max_rows: int) -> list[int]:
    """Row counts a GEMM warm-up runs: each up to 2048, where cuBLAS changes kernels every few
    rows (50-160 kernels per weight shape of Llama-3-8B on an H200), then every 64th and max_rows."""
    return sorted({*range(1, min(max_rows, 2048) + 1), *range(2048, max_rows + 1, 64), max_rows})


def dummy_step_lens(num_tokens: int, max_model_len: int) -> list[int]:
    """Query lengths of the largest step num_tokens allows, as the scheduler could form it: one
    decode row beside prefill chunks of at most max_model_len tokens each (no sequence's
    positions go past it, nor do the model's rotary tables)."""
    rest = num_tokens - 1
    return [1] + [min(max_model_len, rest - i) for i in range(0, rest, max_model_len)]


def dummy_step_tables(num_tokens: int, max_model_len: int,
                      block_size: int) -> tuple[list[int], list[list[int]]]:
    """dummy_step_lens, with a block table for each sequence on consecutive blocks from 0."""
    lens, tables, first = dummy_step_lens(num_tokens, max_model_len), [], 0
    for n in lens:
        count = -(-n // block_size)
        tables.append(list(range(first, first + count)))
        first += count
    return lens, tables


def dummy_step_blocks(num_tokens: int, max_model_len: int, block_size: int) -> int:
    return sum(map(len, dummy_step_tables(num_tokens, max_model_len, block_size)[1]))


# Blocks per swap copy: bounds the device memory a copy stages (64 MiB at Llama-3-8B's shape).
SWAP_CHUNK_BLOCKS = 32


def _swap_runs(copies: list[tuple[int, int]]) -> Iterator[tuple[list[int], int, int]]:
    """(device block ids, first CPU block, count) per run of consecutive CPU blocks, at most
    SWAP_CHUNK_BLOCKS each, from (device block, CPU block) pairs."""
    pairs = sorted(copies, key=lambda p: p[1])
    start = 0
    for end in range(1, len(pairs) + 1):
        if end == len(pairs) or pairs[end][1] != pairs[end - 1][1] + 1 or end - start == SWAP_CHUNK_BLOCKS:
            yield [d for d, _ in pairs[start:end]], pairs[start][1], end - start
            start = end


def kv_heads_per_rank(config: ModelConfig) -> int:
    """KV heads in this rank's cache shard: a share of them, or one replicated head when there
    are fewer KV heads than tensor-parallel ranks."""
    return max(1, config.num_key_value_heads // get_tensor_model_parallel_world_size())


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block on this rank."""
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * kv_heads_per_rank(config) * config.head_dim * elem


@dataclass
class StepInput:
    """One step's forward as plain host data (each rank builds its device inputs from it; the
    token ids, some of which may still be on rank 0's device, come from rank 0 through the
    process group). Sequences are in the order attention wants: those attended as decode rows
    first (AttentionMetadata.build)."""
    block_tables: list[list[int]]
    starts: list[int]             # each sequence's first new position
    query_lens: list[int]         # its new tokens
    logits_index: list[int]       # the flat token of each sampled row, in the caller's sample_rows order
    token_slots: list[int] | None = None  # LoRA: each token's adapter slot (-1: none); None: no LoRA
    num_short: int | None = None  # leading sequences whose tokens are decode rows (None: those of one token)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


def _gemm_key(layer: torch.nn.Module) -> tuple:
    """What picks a linear layer's GEMM kernels: its shape, bias and weight format."""
    if isinstance(layer, PackedLinear):
        weight = ("packed", layer.bits, layer.group_size, layer.scales.dtype, layer.perm is not None)
    else:
        weight = (type(layer).__name__, layer.weight.dtype)
    return layer.in_features, layer.out_features, layer.bias is not None, weight


class ModelRunner:
    def __init__(self, model: torch.nn.Module, config: ModelConfig, num_blocks: int, block_size: int,
                 device: torch.device, kv_cache_dtype: torch.dtype, lora_context: LoRAContext | None = None):
        self.model = model
        self.lora_context = lora_context
        self.block_size = block_size
        self.device = device
        shape = (2, config.num_hidden_layers, num_blocks, block_size, kv_heads_per_rank(config), config.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=kv_cache_dtype, device=device)
        attns = [m for m in model.modules() if isinstance(m, Attention)]
        for i, attn in enumerate(attns):
            attn.k_cache, attn.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
        self.cuda_graphs: CudaGraphRunner | None = None
        # Swap space: [blocks, 2, layers, block_size, kv_heads, head_dim bytes], pinned on CUDA so
        # the copies are asynchronous. Swap copies move raw bytes, whatever the cache's dtype.
        self.cpu_kv_cache = self._block_bytes()[:, :, :0].movedim(2, 0).cpu()

    def _block_bytes(self) -> torch.Tensor:
        """The device cache's bytes: [2, layers, num_blocks, block_size, kv_heads, head_dim * elem]."""
        return self.kv_cache.view(torch.uint8)

    def allocate_swap_space(self, num_blocks: int) -> None:
        shape = (num_blocks, *self.cpu_kv_cache.shape[1:])
        self.cpu_kv_cache = torch.empty(shape, dtype=torch.uint8, pin_memory=self.device.type == "cuda")

    def swap_out(self, copies: list[tuple[int, int]]) -> None:
        """Copy device blocks to swap-space blocks: (device block, CPU block) pairs. Queued on the
        device's stream, so later writes to those device blocks wait for the copies."""
        device_cache = self._block_bytes()
        for device_ids, cpu_start, n in _swap_runs(copies):
            blocks = device_cache[:, :, to_device(device_ids, torch.int64, self.device)]
            self.cpu_kv_cache[cpu_start:cpu_start + n].copy_(blocks.movedim(2, 0), non_blocking=True)

    def swap_in(self, copies: list[tuple[int, int]]) -> None:
        """Copy swap-space blocks to device blocks: (CPU block, device block) pairs."""
        device_cache = self._block_bytes()
        for device_ids, cpu_start, n in _swap_runs([(d, c) for c, d in copies]):
            staged = self.cpu_kv_cache[cpu_start:cpu_start + n].to(self.device, non_blocking=True)
            device_cache.index_copy_(2, to_device(device_ids, torch.int64, self.device), staged.movedim(0, 2))

    def capture_cuda_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        """Decode steps of up to max_num_seqs sequences replay CUDA graphs from now on (CUDA with
        the Triton KV write and attention, which take the graphs' padding rows)."""
        if not (use_triton(self.kv_cache, "kv_cache") and use_triton(self.kv_cache, "paged_attention")):
            return
        self.cuda_graphs = CudaGraphRunner(self.model, max_num_seqs, max_model_len, self.block_size, self.device,
                                           self.lora_context)
        self.cuda_graphs.capture()

    @torch.inference_mode()
    def warm_up(self, max_num_seqs: int, max_num_tokens: int, max_model_len: int) -> None:
        """Launch, once before serving, every kernel a step can launch: a forward at the smallest
        and the largest step (a decode row beside prefill chunks, as a mixed step), each linear
        layer's GEMM at every row count a step can give it, and the logits at every sampled-row
        count. cuBLAS loads a GEMM kernel on its first launch, and that launch waits for the
        device's queue to drain (on an H200: ~155 ms in each prefill step of a first run, the
        LM head's row count new each time); mid-run that throws away the host's lead over the
        device. Writes only into KV blocks nobody holds yet."""
        num_blocks = self.kv_cache.shape[2]
        largest = max_num_tokens
        while largest > 1 and dummy_step_blocks(largest, max_model_len, self.block_size) > num_blocks:
            largest -= self.block_size  # a step that large could not fit in the cache either
        hidden = None
        for num_tokens in sorted({1, max(1, largest)}):
            hidden = self.dummy_step(num_tokens, max_model_len)
        rows = gemm_warm_up_rows(max_num_tokens)
        for layer in self._distinct_linears():
            x = hidden.new_zeros(rows[-1], layer.in_features)
            for num_rows in rows:
                layer(x[:num_rows])
        if self.lora_context is not None:
            self._warm_up_lora(max_num_tokens)
        hidden = hidden.new_zeros(max_num_seqs, hidden.shape[-1])
        for num_rows in range(1, max_num_seqs + 1):
            self.model.compute_logits(hidden[:num_rows])

    def _warm_up_lora(self, max_rows: int) -> None:
        """The LoRA kernels of each layer shape at every row count up to max_rows: Triton compiles
        a variant per tile size, split and row-count specialization (~1 s each), which mid-run
        stalls the steps (1-2 s of a random_workload run on an H200). The slots are empty at startup."""
        layers = {}
        for layer in self.model.modules():
            if isinstance(layer, LoRALinear):
                layers.setdefault((layer.in_features, layer.shard_sizes), layer)
        mapping = LoRAMapping.build([0] * max_rows, self.lora_context.num_slots, self.device)
        for layer in layers.values():
            x = layer.lora_a.new_zeros(max_rows, layer.in_features)
            y = layer.lora_a.new_zeros(max_rows, layer.out_features)
            for num_rows in range(1, max_rows + 1):
                add_lora(y[:num_rows], x[:num_rows], layer.lora_a, layer.lora_b, layer.shard_sizes,
                         mapping.narrow(num_rows))

    @torch.inference_mode()
    def dummy_step(self, num_tokens: int, max_model_len: int, num_sampled: int = 0) -> torch.Tensor:
        """A forward over the step dummy_step_lens describes, on blocks 0.. (the caller makes
        sure they are free and enough: dummy_step_blocks), and the logits of num_sampled of its
        rows, with the sampler's float32 copy beside them, as a step sampling that many would;
        returns the hidden states."""
        lens, tables = dummy_step_tables(num_tokens, max_model_len, self.block_size)
        positions, meta = AttentionMetadata.build(tables, [0] * len(lens), lens, self.block_size, self.device)
        hidden = self.model(torch.zeros(num_tokens, dtype=torch.int64, device=self.device), positions, meta)
        if num_sampled:
            logits = self.model.compute_logits(hidden[:num_sampled])
            if logits is not None:
                logits.float()  # held with the logits at the peak: what the sampler's copy takes
        return hidden

    def _distinct_linears(self) -> list[torch.nn.Module]:
        """One linear layer of each GEMM shape the forward runs (the LM head apart: compute_logits
        takes at most max_num_seqs rows)."""
        head = getattr(self.model, "lm_head", None)
        layers = {}
        for layer in self.model.modules():
            if isinstance(layer, (torch.nn.Linear, Fp8Linear, PackedLinear)) and layer is not head:
                layers.setdefault(_gemm_key(layer), layer)
        return list(layers.values())

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_new_tokens: list[int], sample_rows: list[int],
                pending_token_ids: torch.Tensor | None = None, lora_slots: list[int] | None = None) -> torch.Tensor:
        """Run one forward over the batch and return the logits [len(sample_rows), V] of the
        last new token of each sequence in sample_rows (indices into seqs). An input that is a
        PLACEHOLDER is read from pending_token_ids (the last sampled batch, still on the device)
        at the sequence's pending_row. lora_slots: each sequence's adapter slot (-1: none).
        Nothing here waits for the device."""
        step, input_ids = self.prepare_step(seqs, num_new_tokens, sample_rows, pending_token_ids, lora_slots)
        return self.execute_step(step, input_ids)

    @torch.inference_mode()
    def execute_step(self, step: StepInput, input_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """The forward of a prepared step: the logits of its sampled rows (None on ranks other
        than 0, which pass no input_ids and receive rank 0's)."""
        if input_ids is None:
            input_ids = torch.empty(step.num_tokens, dtype=torch.int64, device=self.device)
        input_ids = tensor_model_parallel_broadcast(input_ids)
        positions, meta = AttentionMetadata.build(step.block_tables, step.starts, step.query_lens,
                                                  self.block_size, self.device, step.num_short)
        logits_index = to_device(step.logits_index, torch.int64, self.device)
        if self.lora_context is not None:
            self._set_lora(step.token_slots)
        graphs = self.cuda_graphs
        if graphs is not None and meta.num_decodes == step.num_tokens <= graphs.max_batch:
            hidden = graphs.run(input_ids, positions, meta)
        else:
            hidden = self.model(input_ids, positions, meta)
        return self.model.compute_logits(hidden[logits_index])

    def _set_lora(self, token_slots: list[int] | None) -> None:
        """The mapping the LoRA layers read in the next forward: None where no token uses an
        adapter, except under CUDA graphs, which replay theirs (all -1 then)."""
        if token_slots is not None and (self.cuda_graphs is not None or max(token_slots) >= 0):
            self.lora_context.mapping = LoRAMapping.build(token_slots, self.lora_context.num_slots, self.device)
        else:
            self.lora_context.mapping = None

    @torch.inference_mode()
    def embed(self, token_ids: list[int], block_table: list[int]) -> torch.Tensor:
        """Prefill token_ids into the given (scratch) blocks in one forward; return the mean of the
        final-normed hidden states, L2-normalized, as float32 [hidden]."""
        positions, meta = AttentionMetadata.build([block_table], [0], [len(token_ids)],
                                                  self.block_size, self.device)
        input_ids = to_device(token_ids, torch.int64, self.device)
        if self.lora_context is not None:
            self._set_lora(None)
        hidden = self.model(input_ids, positions, meta).float()  # [T, hidden]
        return torch.nn.functional.normalize(hidden.mean(0), dim=0).cpu()

    def prepare_step(self, seqs: list[Sequence], num_new_tokens: list[int], sample_rows: list[int],
                     pending_token_ids: torch.Tensor | None = None, lora_slots: list[int] | None = None
                     ) -> tuple[StepInput, torch.Tensor]:
        """The host side of execute: the step's StepInput and its token ids on the device."""
        # Attention wants the sequences attended as decode rows first (decodes, and the short chunks
        # of output tokens such as forced text; a prompt's chunk keeps the prefill kernel's numerics
        # whatever the prefix cache held), sorted by context length, which lets it group them with
        # little padding: `order`; logits_index maps the caller's sample_rows to tokens.
        decode_rows = [n == 1 or (n <= SHORT_CHUNK and s.is_prefilled) for s, n in zip(seqs, num_new_tokens)]
        order = sorted(range(len(seqs)), key=lambda i: (not decode_rows[i], seqs[i].num_computed_tokens))
        token_slots = None
        if self.lora_context is not None:
            slots = lora_slots or [-1] * len(seqs)
            token_slots = [slots[i] for i in order for _ in range(num_new_tokens[i])]
        seqs = [seqs[i] for i in order]
        num_new_tokens = [num_new_tokens[i] for i in order]
        starts = [s.num_computed_tokens for s in seqs]
        input_ids = [t for s, start, n in zip(seqs, starts, num_new_tokens) for t in s.token_ids[start:start + n]]
        last_index = [0] * len(order)  # in the caller's order
        pending = []                   # (flat index, pending_row) of inputs still on the device
        for i, seq, n, end in zip(order, seqs, num_new_tokens, itertools.accumulate(num_new_tokens)):
            last_index[i] = end - 1
            if seq.token_ids[-1] == PLACEHOLDER and seq.num_computed_tokens + n == seq.num_tokens:
                pending.append((end - 1, seq.pending_row))
        input_ids = to_device(input_ids, torch.int64, self.device)
        if pending:
            flat, rows = zip(*pending)
            input_ids[to_device(flat, torch.int64, self.device)] = \
                pending_token_ids[to_device(rows, torch.int64, self.device)]
        step = StepInput([s.block_table for s in seqs], starts, num_new_tokens,
                         [last_index[i] for i in sample_rows], token_slots, sum(decode_rows))
        return step, input_ids
