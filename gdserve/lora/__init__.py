"""LoRA adapters over the base model: PEFT checkpoints, GPU slots, batched per-token deltas."""
from gdserve.lora.request import LoRARequest

__all__ = ["LoRARequest"]
