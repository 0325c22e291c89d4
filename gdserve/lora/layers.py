"""LoRA over the base model's projections: each wrapped linear layer holds its adapters' A and B
in `max_loras` GPU slots and adds, after the base GEMM, every token's delta from the slot its
sequence uses (one batched op per layer for the whole step: gdserve.kernels.lora)."""
from dataclasses import dataclass

import torch
from torch import nn

from gdserve.kernels.lora import LoRAMapping, add_lora
from gdserve.lora.adapter import LoRALayerWeights

# The projections adapters may target, by our (fused) module names.
TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass
class LoRAContext:
    """What every LoRALinear of a model reads in its forward: the step's token -> slot mapping
    (None: no token of the step uses an adapter), over the layers' num_slots (max_loras) slots."""
    num_slots: int
    mapping: LoRAMapping | None = None


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, context: LoRAContext, max_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.base = base
        self.context = context
        self.in_features, self.out_features = base.in_features, base.out_features
        self.shard_sizes = tuple(getattr(base, "shard_sizes", None) or (base.out_features,))
        shape_a = (max_loras, len(self.shard_sizes), max_rank, self.in_features)
        self.register_buffer("lora_a", torch.zeros(shape_a, dtype=dtype, device=device), persistent=False)
        self.register_buffer("lora_b", torch.zeros(max_loras, self.out_features, max_rank, dtype=dtype,
                                                   device=device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        mapping = self.context.mapping
        if mapping is not None:
            add_lora(y.view(-1, self.out_features), x.reshape(-1, self.in_features), self.lora_a, self.lora_b,
                     self.shard_sizes, mapping)
        return y

    def set_slot(self, slot: int, weights: LoRALayerWeights | None) -> None:
        """Write an adapter's weights for this layer into `slot` (zeros where it has none)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        if weights is None:
            return
        offset = 0
        for shard, (a, b, size) in enumerate(zip(weights.lora_a, weights.lora_b, self.shard_sizes)):
            if a is not None:
                rank = a.shape[0]
                self.lora_a[slot, shard, :rank].copy_(a)
                self.lora_b[slot, offset:offset + size, :rank].copy_(b)
            offset += size


def wrap_lora_layers(model: nn.Module, max_loras: int, max_rank: int, dtype: torch.dtype,
                     device: torch.device) -> tuple[LoRAContext, dict[str, LoRALinear]]:
    """Wrap every target projection of `model` in place; returns the shared context and the
    wrapped layers by their module name (the names adapters are keyed by)."""
    context = LoRAContext(max_loras)
    targets = [(name, module) for name, module in model.named_modules() if name.rpartition(".")[2] in TARGETS]
    layers = {}
    for name, base in targets:
        parent_name, _, leaf = name.rpartition(".")
        layer = LoRALinear(base, context, max_loras, max_rank, dtype, device)
        setattr(model.get_submodule(parent_name), leaf, layer)
        layers[name] = layer
    return context, layers
