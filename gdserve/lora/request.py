"""A request's choice of LoRA adapter (vLLM's LoRARequest: the same fields and meaning)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str        # the name clients use (the server's `model` field)
    lora_int_id: int      # unique per adapter, >= 1; prefix-cache blocks and GPU slots are keyed by it
    lora_path: str = ""   # a PEFT adapter directory (adapter_config.json + adapter weights)
    base_model_name: str | None = None

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError("LoRARequest.lora_name must be a non-empty string")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str):
            raise ValueError("LoRARequest.lora_path must be a string (a directory)")
