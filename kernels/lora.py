"""Batched multi-LoRA deltas: each token of a step adds its adapter's (x @ A^T) @ B^T to a linear
layer's output, the adapter being the one in its sequence's GPU slot (-1: none). On the CPU: a
native kernel for few tokens (csrc/lora.c), dense torch matmuls on views for more; CUDA tensors go
to the Triton kernels, which take the tokens grouped by slot on the device (`LoRAGroups`)."""
import ctypes
import itertools
from dataclasses import dataclass, field
from functools import cache, cached_property

import torch

from gdserve.kernels import native
from gdserve.kernels.lora_groups import LoRAGroups
from gdserve.kernels.triton import use_triton

# On the CPU (scripts/lora_cpu.py): the native kernel (token by token, one call) for steps of up to
# NATIVE_ALWAYS tokens, and for steps whose adapters are interleaved up to NATIVE_MAX_TOKENS of
# their dtype; else the torch path's dense matmuls, per run of tokens where there is one run per
# slot or runs of CPU_MIN_RUN tokens on average, otherwise per slot over all rows, masked.
NATIVE_ALWAYS = 16
NATIVE_MAX_TOKENS = {torch.float32: 128, torch.bfloat16: 64}
CPU_MIN_RUN = 4


@dataclass(frozen=True)
class LoRARuns:
    """The runs of consecutive tokens sharing a slot >= 0, built on the host: the CPU path's groups."""
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    slots: tuple[int, ...]

    @classmethod
    def of(cls, token_slots: list[int]) -> "LoRARuns":
        starts, lengths, slots, start = [], [], [], 0
        for slot, group in itertools.groupby(token_slots):
            length = sum(1 for _ in group)
            if slot >= 0:
                starts.append(start), lengths.append(length), slots.append(slot)
            start += length
        return cls(tuple(starts), tuple(lengths), tuple(slots))

    def __len__(self) -> int:
        return len(self.starts)

    @cached_property
    def active_slots(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.slots)))

    @cached_property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @cached_property
    def max_length(self) -> int:
        return max(self.lengths, default=0)

    def narrow(self, num_tokens: int) -> "LoRARuns":
        kept = [i for i, start in enumerate(self.starts) if start < num_tokens]
        return LoRARuns(tuple(self.starts[i] for i in kept),
                        tuple(min(self.lengths[i], num_tokens - self.starts[i]) for i in kept),
                        tuple(self.slots[i] for i in kept))


@dataclass
class LoRAMapping:
    """Which GPU slot's adapter each token of a step uses; -1 = none (base model). num_slots: the
    slots the adapters' weights have (max_loras); every slot is below it."""
    token_slots: torch.Tensor  # int32 [T] on the model's device
    num_slots: int
    # Host-built by `build`; None for a graph's mapping (`static`), whose kernels read device tensors only.
    runs: LoRARuns | None = None
    # Made at first use (the CPU path never needs them); shared with the mappings narrowed from this one.
    _groups: LoRAGroups | None = field(default=None, repr=False, compare=False)
    _masks: dict = field(default_factory=dict, repr=False, compare=False)  # (slot, dtype) -> [T, 1]

    @classmethod
    def build(cls, token_slots: list[int], num_slots: int, device: torch.device) -> "LoRAMapping":
        bad = next((s for s in token_slots if not -1 <= s < num_slots), None)
        if bad is not None:
            raise ValueError(f"LoRAMapping token slots are GPU slots 0..{num_slots - 1} or -1 (no adapter), got {bad}")
        return cls(torch.tensor(token_slots, dtype=torch.int32, device=device), num_slots, LoRARuns.of(token_slots))

    @classmethod
    def static(cls, max_tokens: int, num_slots: int, device) -> "LoRAMapping":
        """For CUDA graphs: all -1 until `copy_`; its groups are made now, before any capture."""
        token_slots = torch.full((max_tokens,), -1, dtype=torch.int32, device=device)
        return cls(token_slots, num_slots, _groups=LoRAGroups.of(token_slots, num_slots))

    @property
    def num_tokens(self) -> int:
        return self.token_slots.shape[0]

    @property
    def graph_safe(self) -> bool:
        """Whether this mapping's kernels read only device tensors (it came from `static`)."""
        return self.runs is None

    @property
    def groups(self) -> LoRAGroups:
        """The tokens grouped by slot (the Triton kernels' input). A narrowed mapping's are its
        parent's, whose groups may hold tokens past its own: the kernels skip those."""
        if self._groups is None:
            self._groups = LoRAGroups.of(self.token_slots, self.num_slots)
        return self._groups

    def copy_(self, other: "LoRAMapping") -> None:
        """For CUDA graphs: overwrite this mapping's tensors in place with other's (other has
        <= as many tokens; the rest of this one become -1), its groups too, regrouped on the
        device. A graph captured over this mapping, or over one narrowed from it, must then
        compute other's deltas. Kernels launched for a graph must not depend on host values that
        change between steps."""
        n = other.num_tokens
        if n > self.num_tokens:
            raise ValueError(f"LoRAMapping.copy_: {n} tokens do not fit in a mapping of {self.num_tokens}")
        if other.num_slots > self.num_slots:
            raise ValueError(f"LoRAMapping.copy_: a mapping over {other.num_slots} slots into one over {self.num_slots}")
        if self._groups is not None and self._groups.sorted_indices.shape[0] != self.num_tokens:
            raise ValueError("LoRAMapping.copy_: into a narrowed mapping (its groups are its parent's); copy into the parent")
        self.token_slots[:n].copy_(other.token_slots)
        self.token_slots[n:].fill_(-1)
        self._masks.clear()
        if self._groups is not None:
            self._groups.copy_(LoRAGroups.of(self.token_slots, self.num_slots))
        if not self.graph_safe:
            self.runs = other.host_runs()

    def narrow(self, num_tokens: int) -> "LoRAMapping":
        """The first num_tokens rows (a view, sharing this mapping's groups: within each group the
        tokens are in order, so those below num_tokens come first, and copy_ into this mapping
        regroups the narrowed one too)."""
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"LoRAMapping.narrow: {num_tokens} tokens of a mapping of {self.num_tokens}")
        runs = None if self.graph_safe else self.runs.narrow(num_tokens)
        return LoRAMapping(self.token_slots[:num_tokens], self.num_slots, runs, self.groups)

    def host_runs(self) -> LoRARuns:
        """The runs; a graph's mapping reads them back from the device."""
        return self.runs if self.runs is not None else LoRARuns.of(self.token_slots.tolist())

    def mask(self, slot: int, dtype: torch.dtype) -> torch.Tensor:
        """[T, 1]: 1 where the token uses `slot`, else 0 (made once per step and dtype; a graph's
        mapping, which copy_ may change through a parent, makes it every time)."""
        if self.graph_safe:
            return (self.token_slots == slot).to(dtype).unsqueeze(1)
        key = (slot, dtype)
        if key not in self._masks:
            self._masks[key] = (self.token_slots == slot).to(dtype).unsqueeze(1)
        return self._masks[key]


def add_lora_reference(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                       shard_sizes: tuple[int, ...], mapping: LoRAMapping) -> None:
    """The definition, per token in float32 (gathers each token's weights: for tests)."""
    check_lora_args(y, x, lora_a, lora_b, shard_sizes, mapping)
    rows = (mapping.token_slots >= 0).nonzero().squeeze(1).to(y.device)
    if rows.numel() == 0:
        return
    slots = mapping.token_slots[rows].long().to(y.device)
    h = torch.einsum("tk,tirk->tir", x[rows].float(), lora_a[slots].float())         # [t, shards, R]
    shard_of_column = torch.repeat_interleave(torch.arange(len(shard_sizes), device=y.device),
                                              torch.tensor(shard_sizes, device=y.device))
    delta = torch.einsum("tnr,tnr->tn", h[:, shard_of_column], lora_b[slots].float())  # [t, N]
    y[rows] = (y[rows].float() + delta).to(y.dtype)


def add_lora(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
             shard_sizes: tuple[int, ...], mapping: LoRAMapping) -> None:
    """In place: for each token t whose slot s = mapping.token_slots[t] >= 0, and each shard i
    (the output columns [off_i, off_i + shard_sizes[i]) of y, off_i = sum(shard_sizes[:i])):
        y[t, off_i:off_i+n_i] += (x[t] @ lora_a[s, i].T) @ lora_b[s, off_i:off_i+n_i].T
    x [T, K] (bf16/fp16/fp32), y [T, N] same dtype, N = sum(shard_sizes);
    lora_a [num_slots, num_shards, R, K], lora_b [num_slots, N, R], same dtype as x (the
    adapter's scaling is already folded into lora_b; ranks below R are zero-padded; a slot with
    no adapter for this layer is all zeros). Accumulate in float32.

    The CPU's torch matmuls (steps of many tokens) round x @ A^T to x's dtype once where it is 16-bit."""
    check_lora_args(y, x, lora_a, lora_b, shard_sizes, mapping)
    if mapping.runs is not None and not mapping.runs:  # no token has an adapter this step
        return
    if x.is_cuda and use_triton(x, "lora") and y.stride(1) == 1 and lora_a.is_contiguous() and lora_b.is_contiguous():
        from gdserve.kernels.triton.lora import add_lora_triton
        add_lora_triton(y, x if x.stride(1) == 1 else x.contiguous(), lora_a, lora_b, shard_sizes, mapping.groups)
        return
    runs = mapping.host_runs()
    if not runs:
        return
    tokens = x.shape[0]
    in_runs = len(runs) <= len(runs.active_slots) or len(runs) * CPU_MIN_RUN <= runs.num_tokens
    kernel = native.kernel("add_lora", x)
    if kernel is not None and (tokens <= NATIVE_ALWAYS or not in_runs and tokens <= NATIVE_MAX_TOKENS[x.dtype]) \
            and x.stride(1) == 1 and y.stride(1) == 1 and lora_a.is_contiguous() and lora_b.is_contiguous():
        _add_lora_native(kernel, y, x, lora_a, lora_b, shard_sizes, mapping)
    elif in_runs:
        _add_lora_runs(y, x, lora_a, lora_b, shard_sizes, runs)
    else:
        _add_lora_masked(y, x, lora_a, lora_b, shard_sizes, mapping)


def _add_lora_native(kernel, y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                     shard_sizes: tuple[int, ...], mapping: LoRAMapping) -> None:
    (t, k), (n, rank) = x.shape, lora_b.shape[1:]
    h = torch.empty(t, len(shard_sizes) * rank, dtype=torch.float32)
    kernel(native.ptr(y), native.ptr(x), native.ptr(lora_a), native.ptr(lora_b), native.ptr(mapping.token_slots),
           ctypes.c_long(t), ctypes.c_long(k), ctypes.c_long(n), rank, len(shard_sizes), _shard_ends(tuple(shard_sizes)),
           ctypes.c_long(y.stride(0)), ctypes.c_long(x.stride(0)), native.ptr(h), torch.get_num_threads())


@cache
def _shard_ends(shard_sizes: tuple[int, ...]) -> ctypes.Array:
    return (ctypes.c_long * len(shard_sizes))(*itertools.accumulate(shard_sizes))


def _a_rows(lora_a: torch.Tensor) -> torch.Tensor:
    """lora_a as [slots, shards * R, K]."""
    return lora_a.view(lora_a.shape[0], -1, lora_a.shape[3]) if lora_a.is_contiguous() else lora_a.flatten(1, 2)


def _add_lora_runs(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                   shard_sizes: tuple[int, ...], runs: LoRARuns) -> None:
    """Dense matmuls on each run's rows (views: no gathers)."""
    a_rows = _a_rows(lora_a)
    for start, length, slot in zip(runs.starts, runs.lengths, runs.slots):
        x_run, y_run = (x, y) if length == x.shape[0] else (x[start:start + length], y[start:start + length])
        _expand(y_run, x_run @ a_rows[slot].t(), lora_b[slot], shard_sizes, lora_a.shape[2])


def _add_lora_masked(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                     shard_sizes: tuple[int, ...], mapping: LoRAMapping) -> None:
    """Dense matmuls over all rows once per active slot, the other slots' rows masked to zero."""
    a_rows = _a_rows(lora_a)
    for slot in mapping.host_runs().active_slots:
        h = x @ a_rows[slot].t()
        h.mul_(mapping.mask(slot, h.dtype))
        _expand(y, h, lora_b[slot], shard_sizes, lora_a.shape[2])


def _expand(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, shard_sizes: tuple[int, ...], rank: int) -> None:
    """y[:, shard i] += h[:, rank block i] @ b[shard i].T"""
    if len(shard_sizes) == 1:
        y.addmm_(h, b.t())
        return
    for y_shard, h_shard, b_shard in zip(y.split(shard_sizes, 1), h.split(rank, 1), b.split(shard_sizes, 0)):
        y_shard.addmm_(h_shard, b_shard.t())


def check_lora_args(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                    shard_sizes: tuple[int, ...], mapping: LoRAMapping) -> None:
    """Raise ValueError naming the first mismatch between the shapes, dtypes and devices."""
    if x.dim() != 2 or y.dim() != 2 or lora_a.dim() != 4 or lora_b.dim() != 3:
        raise ValueError(f"add_lora takes x [T, K], y [T, N], lora_a [slots, shards, R, K], lora_b [slots, N, R]; "
                         f"got x {list(x.shape)}, y {list(y.shape)}, lora_a {list(lora_a.shape)}, "
                         f"lora_b {list(lora_b.shape)}")
    (t, k), n = x.shape, sum(shard_sizes)
    num_slots, num_shards, rank, a_k = lora_a.shape
    problem = None
    if y.shape[0] != t or mapping.num_tokens != t:
        problem = f"x has {t} tokens, y {y.shape[0]}, the mapping {mapping.num_tokens}"
    elif y.shape[1] != n or num_shards != len(shard_sizes):
        problem = f"shard_sizes {tuple(shard_sizes)} against y's {y.shape[1]} columns and lora_a's {num_shards} shards"
    elif a_k != k:
        problem = f"lora_a's input size {a_k} is not x's {k}"
    elif tuple(lora_b.shape) != (num_slots, n, rank):
        problem = f"lora_b {list(lora_b.shape)} is not [slots={num_slots}, N={n}, R={rank}] as lora_a implies"
    elif not x.dtype == y.dtype == lora_a.dtype == lora_b.dtype:
        problem = f"dtypes differ: x {x.dtype}, y {y.dtype}, lora_a {lora_a.dtype}, lora_b {lora_b.dtype}"
    elif not x.device == y.device == lora_a.device == lora_b.device == mapping.token_slots.device:
        problem = (f"devices differ: x {x.device}, y {y.device}, lora_a {lora_a.device}, lora_b {lora_b.device}, "
                   f"mapping {mapping.token_slots.device}")
    elif mapping.runs and mapping.runs.active_slots[-1] >= num_slots:
        problem = f"the mapping uses slot {mapping.runs.active_slots[-1]}; lora_a has {num_slots} slots"
    elif mapping.num_slots > num_slots:
        problem = f"the mapping is over {mapping.num_slots} slots; lora_a has {num_slots}"
    if problem:
        raise ValueError(f"add_lora: {problem}")
