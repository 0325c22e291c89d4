"""Random LoRA adapters in PEFT's format (adapter_config.json + adapter_model.safetensors) for a
model's real projection shapes, written without peft: what `gdserve bench throughput --lora`
serves, so a config-only model directory is enough."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig

from gdserve.models.config import ModelConfig

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
B_STD = 0.02  # a weight initializer's scale: the adapters change the output without swamping it


@dataclass(frozen=True)
class Projection:
    module: str  # "self_attn" or "mlp"
    in_features: int
    out_features: int


def projection_shapes(config: ModelConfig) -> dict[str, Projection]:
    """Each LoRA-targetable projection of one decoder layer (HF names), by its real shape."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    return {"q_proj": Projection("self_attn", hidden, q_size),
            "k_proj": Projection("self_attn", hidden, kv_size),
            "v_proj": Projection("self_attn", hidden, kv_size),
            "o_proj": Projection("self_attn", q_size, hidden),
            "gate_proj": Projection("mlp", hidden, inter),
            "up_proj": Projection("mlp", hidden, inter),
            "down_proj": Projection("mlp", inter, hidden)}


def parse_targets(text: str) -> tuple[str, ...]:
    """`q_proj,v_proj` -> ("q_proj", "v_proj"), checked against PROJECTIONS."""
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    check_targets(targets)
    return targets


def check_targets(targets: tuple[str, ...]) -> None:
    if not targets:
        raise ValueError("LoRA targets: no projection named")
    unknown = [t for t in targets if t not in PROJECTIONS]
    if unknown:
        raise ValueError(f"LoRA targets: unknown projection(s) {', '.join(unknown)}; "
                         f"choose from {','.join(PROJECTIONS)}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"LoRA targets: a projection named twice in {','.join(targets)}")


def random_lora_weights(config: ModelConfig, rank: int, targets: tuple[str, ...], dtype: torch.dtype,
                        seed: int) -> dict[str, torch.Tensor]:
    """PEFT's state dict keys; A uniform in +-1/sqrt(in_features) (PEFT's init of A), B normal
    (PEFT starts B at zero, which would leave the output unchanged)."""
    shapes = projection_shapes(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for name in targets:
            p = shapes[name]
            prefix = f"base_model.model.model.layers.{layer}.{p.module}.{name}"
            bound = p.in_features ** -0.5
            a = torch.rand(rank, p.in_features, generator=generator) * (2 * bound) - bound
            b = torch.randn(p.out_features, rank, generator=generator) * B_STD
            tensors[f"{prefix}.lora_A.weight"] = a.to(dtype)
            tensors[f"{prefix}.lora_B.weight"] = b.to(dtype)
    return tensors


def adapter_config(base_model: str, rank: int, targets: tuple[str, ...]) -> dict:
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": rank, "lora_alpha": rank, "lora_dropout": 0.0, "target_modules": list(targets),
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "modules_to_save": None, "layers_to_transform": None, "inference_mode": True}


def write_random_adapter(path: Path, model_dir: Path, rank: int, targets: tuple[str, ...] = PROJECTIONS,
                         dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Path:
    """One adapter of `rank` over `targets` of every layer of the HF-format model in model_dir
    (its config.json is all that is read)."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    check_targets(targets)
    config = ModelConfig.from_hf(AutoConfig.from_pretrained(model_dir))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(random_lora_weights(config, rank, targets, dtype, seed), path / "adapter_model.safetensors",
              metadata={"format": "pt"})
    (path / "adapter_config.json").write_text(json.dumps(adapter_config(str(model_dir), rank, targets), indent=2))
    return path


def write_random_adapters(root: Path, model_dir: Path, num_adapters: int, rank: int,
                          targets: tuple[str, ...] = PROJECTIONS, dtype: torch.dtype = torch.bfloat16) -> list[Path]:
    """`num_adapters` adapters, each its own random weights, in root/adapter{i}."""
    if num_adapters < 1:
        raise ValueError(f"num_adapters must be >= 1, got {num_adapters}")
    return [write_random_adapter(Path(root) / f"adapter{i}", model_dir, rank, targets, dtype, seed=i)
            for i in range(num_adapters)]
