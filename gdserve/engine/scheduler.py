"""Continuous batching: every step shares one token budget between running sequences (decodes
and unfinished prefill chunks), swapped-out ones coming back, and newly admitted ones, FCFS;
preempts the newest when the KV cache runs out of blocks. A new sequence is admitted only while
the blocks left free cover what the running ones are expected to grow by (GrowthReserve).

A preempted sequence is swapped out (preemption_mode "swap": its blocks copied to CPU memory,
its computed tokens kept) where the swap space has room, else recomputed (its blocks dropped, its
tokens prefilled again when it is readmitted). Swapped-out sequences come back before any new
one is admitted.
"""
from collections import deque
from dataclasses import dataclass, field

from gdserve.engine.growth_reserve import GrowthReserve
from gdserve.engine.kv_cache_manager import KVCacheManager
from gdserve.engine.request import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]
    preempted: list[Sequence] = field(default_factory=list)
    # KV block copies to make before the forward: out to the swap space first, then back in
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, CPU)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)   # (CPU, device)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_preempted(self) -> int:
        return len(self.preempted)

    @property
    def swapped_out(self) -> list[Sequence]:
        return [seq for seq in self.preempted if seq.status == SequenceStatus.SWAPPED]


class Scheduler:
    def __init__(self, kv_cache: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_loras: int = 0, preemption_mode: str = "recompute",
                 growth_reserve: GrowthReserve | None = None):
        self.kv_cache = kv_cache
        self.growth_reserve = growth_reserve if growth_reserve is not None else GrowthReserve()
        self.preemption_mode = preemption_mode
        self.max_loras = max_loras  # distinct adapters the running batch may use
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_preemptions = 0
        self.num_swap_outs = 0  # preemptions that swapped (the others recomputed)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch([], [])
        budget = self.max_num_batched_tokens
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            if seq.num_output_tokens >= seq.max_tokens:  # its last token is still in flight
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._allocate_or_preempt(seq, num_new, batch):
                continue
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        if batch.num_preempted == 0:
            budget = self._swap_in(batch, budget)
            if not self.swapped:
                self._admit_waiting(batch, budget)
        return batch

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        while not self.kv_cache.allocate_slots(seq, num_new):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _swap_in(self, batch: ScheduledBatch, budget: int) -> int:
        """Bring swapped-out sequences back, in arrival order, while blocks, seats and adapters
        allow; returns the budget left."""
        loras = self._running_loras()
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.swapped[0]
            if self._exceeds_max_loras(seq, loras):
                break
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            copies = self.kv_cache.swap_in(seq, num_new)
            if copies is None:
                if self.running:
                    break
                # Nothing runs to free blocks: swapped sequences hold the device blocks they share,
                # so the newest gives them up (recomputed later) until the oldest fits.
                self._recompute(self.swapped.pop())
                continue
            self.swapped.popleft()
            batch.blocks_to_swap_in += copies
            self._start_running(seq, num_new, batch, loras)
            budget -= num_new
        return budget

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        """FCFS, except that a sequence whose adapter would exceed max_loras waits (keeping its
        place) while those behind it go in. While anything runs, a sequence goes in only if the
        blocks left free cover the expected growth of the running ones and its own."""
        loras = self._running_loras()
        held_back: list[Sequence] = []
        block_size = self.kv_cache.block_size
        admits = self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
        reserved = self.growth_reserve.reserved_tokens(self.running, block_size) if admits else 0.0
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.leader is not None and not seq.leader.is_prefilled and not seq.leader.is_finished:
                break  # its prompt blocks are about to be cached by the leader: wait for them
            if self._exceeds_max_loras(seq, loras):
                held_back.append(self.waiting.popleft())
                continue
            computed = self.kv_cache.get_computed_blocks(seq)
            num_cached = len(computed) * block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            num_slots = -(-(num_cached + num_new) // block_size) * block_size
            growth = self.growth_reserve.expected_tokens(seq, num_slots)
            reserve = -int(-(reserved + growth) // block_size) if self.running else 0
            if not self.kv_cache.allocate_slots(seq, num_new, computed, reserve):
                break
            reserved += growth
            self.waiting.popleft()
            seq.num_computed_tokens = num_cached
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_cached
            self._start_running(seq, num_new, batch, loras)
            budget -= num_new
        self.waiting.extendleft(reversed(held_back))

    def _running_loras(self) -> set[int]:
        if not self.max_loras:  # no LoRA: skip a pass over the running batch each step
            return set()
        return {s.lora_int_id for s in self.running if s.lora_int_id}

    def _exceeds_max_loras(self, seq: Sequence, loras: set[int]) -> bool:
        return bool(seq.lora_int_id) and seq.lora_int_id not in loras and len(loras) >= self.max_loras

    def _start_running(self, seq: Sequence, num_new: int, batch: ScheduledBatch, loras: set[int]) -> None:
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        batch.seqs.append(seq)
        batch.num_new_tokens.append(num_new)
        if seq.lora_int_id:
            loras.add(seq.lora_int_id)

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        seq.num_preemptions += 1
        self.num_preemptions += 1
        batch.preempted.append(seq)
        copies = self.kv_cache.swap_out(seq) if self.preemption_mode == "swap" else None
        if copies is not None:
            batch.blocks_to_swap_out += copies
            seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(seq)  # victims go newest first: the queue keeps arrival order
            self.num_swap_outs += 1
            return
        self._recompute(seq)

    def _recompute(self, seq: Sequence) -> None:
        """Drop the KV blocks, keep the tokens, go back to the head of the queue."""
        self.kv_cache.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence from wherever it is and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.swapped:
            self.swapped.remove(seq)
        self.kv_cache.free(seq)
        seq.status = SequenceStatus.FINISHED
        if seq.finish_reason not in ("abort", "error"):
            self.growth_reserve.record(seq)
