"""A step's tokens grouped by LoRA slot on the device: what the Triton LoRA kernels read."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class LoRAGroups:
    """A step's tokens grouped by slot, on the device, where the Triton kernels read them (so a
    CUDA graph replays them for any mapping): `sorted_indices` int32 [T], the token indices with
    slot 0's first, then slot 1's, ..., the tokens without an adapter last, each group in token
    order; `slot_counts` int32 [num_slots], each slot's tokens; `slot_starts` int32 [num_slots],
    where each slot's group starts in sorted_indices."""
    sorted_indices: torch.Tensor
    slot_counts: torch.Tensor
    slot_starts: torch.Tensor

    @classmethod
    def of(cls, token_slots: torch.Tensor, num_slots: int) -> "LoRAGroups":
        """Device ops only, none waiting for the host."""
        key = torch.where(token_slots < 0, num_slots, token_slots)  # no adapter: after the last slot
        sorted_indices = torch.argsort(key, stable=True).to(torch.int32)
        slots = torch.arange(num_slots, dtype=key.dtype, device=key.device)
        slot_counts = (key == slots[:, None]).sum(1, dtype=torch.int32)
        return cls(sorted_indices, slot_counts, slot_counts.cumsum(0, dtype=torch.int32) - slot_counts)

    def copy_(self, other: "LoRAGroups") -> None:
        self.sorted_indices.copy_(other.sorted_indices)
        self.slot_counts.copy_(other.slot_counts)
        self.slot_starts.copy_(other.slot_starts)
