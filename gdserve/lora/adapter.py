"""Load a PEFT LoRA adapter for our model: each HF projection's lora_A / lora_B lands in its shard of
our (possibly fused) module with the scaling folded into B, checked against the model's names and
shapes; CPU tensors."""
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from gdserve.lora.peft_config import CONFIG_FILE, LoRALoadError, PeftLoRAConfig
from gdserve.models.llama import FUSED

__all__ = ["LoRAAdapter", "LoRALayerWeights", "LoRALoadError", "load_adapter"]

WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")  # peft reads the first it finds
UNFUSED = ("o_proj", "down_proj")
# peft's tensor names: base_model.model.<module>.lora_A[.<adapter name>].weight
KEY = re.compile(r"(?:base_model\.model\.)?(?P<module>.+)\.(?P<kind>lora_A|lora_B)(?:\.[^.]+)?\.weight")


@dataclass
class LoRALayerWeights:
    """One of our modules' LoRA, per shard (o_proj and down_proj have one); None where the
    adapter leaves that shard alone."""
    lora_a: list[torch.Tensor | None]   # [r, in_features]
    lora_b: list[torch.Tensor | None]   # [shard_out, r], scaling folded in


@dataclass
class LoRAAdapter:
    path: str
    rank: int                            # the largest over its modules
    layers: dict[str, LoRALayerWeights]  # by our module name, e.g. "model.layers.0.self_attn.qkv_proj"

    def num_bytes(self) -> int:
        return sum(t.nbytes for layer in self.layers.values()
                   for t in (*layer.lora_a, *layer.lora_b) if t is not None)


@dataclass(frozen=True)
class _Shard:
    """Where one HF projection lives in our model."""
    module: str
    index: int
    num_shards: int
    in_features: int
    out_features: int


def load_adapter(path: str, model: nn.Module, max_rank: int,
                 dtype: torch.dtype | None = None) -> LoRAAdapter:
    """Read a PEFT adapter directory (adapter_config.json + adapter_model.safetensors or .bin),
    check it against `model` (our LlamaForCausalLM: module names and shapes), return CPU tensors
    (in `dtype`, else the checkpoint's)."""
    try:
        return _load(Path(path), model, max_rank, dtype)
    except LoRALoadError as e:
        raise LoRALoadError(f"LoRA adapter {path!r}: {e}") from None


def _load(path: Path, model: nn.Module, max_rank: int, dtype: torch.dtype | None) -> LoRAAdapter:
    config = PeftLoRAConfig.from_dir(path)
    shards = _projection_shards(model)
    ranks = _target_ranks(config, shards, _other_module_names(model, shards))
    _check_ranks(ranks, max_rank)
    layers: dict[str, LoRALayerWeights] = {}
    for name, ((a_key, a), (b_key, b)) in _pair(_read_tensors(path), ranks, shards).items():
        shard, r = shards[name], ranks[name]
        _check_tensor(a_key, a, (r, shard.in_features), f"rank {r} x in_features")
        _check_tensor(b_key, b, (shard.out_features, r), f"out_features x rank {r}")
        layer = layers.setdefault(shard.module, LoRALayerWeights([None] * shard.num_shards,
                                                                 [None] * shard.num_shards))
        layer.lora_a[shard.index] = a.to(dtype or a.dtype)
        layer.lora_b[shard.index] = (b.float() * config.scaling(name)).to(dtype or b.dtype)
    return LoRAAdapter(str(path), max(ranks.values()), layers)


def _projection_shards(model: nn.Module) -> dict[str, _Shard]:
    """HF projection name (e.g. "model.layers.0.self_attn.k_proj") -> its place in our model."""
    shards = {}
    for name, module in model.named_modules():
        parent, _, leaf = name.rpartition(".")
        if leaf in FUSED:
            sizes = getattr(module, "shard_sizes", None)
            if sizes is None:
                raise ValueError(f"{name} ({type(module).__name__}) does not record its shard sizes")
            for index, (hf_leaf, size) in enumerate(zip(FUSED[leaf], sizes, strict=True)):
                shards[f"{parent}.{hf_leaf}"] = _Shard(name, index, len(sizes), module.in_features, size)
        elif leaf in UNFUSED:
            shards[name] = _Shard(name, 0, 1, module.in_features, module.out_features)
    return shards


def _other_module_names(model: nn.Module, shards: dict[str, _Shard]) -> list[str]:
    """The model's other module names, which an adapter may name but we cannot serve."""
    ours = {shard.module for shard in shards.values()}
    names = [name for name, _ in model.named_modules() if name and name not in ours]
    return names if "lm_head" in names else [*names, "lm_head"]  # a tied head is the embedding


def _target_ranks(config: PeftLoRAConfig, shards: dict[str, _Shard], others: list[str]) -> dict[str, int]:
    """The HF projections the adapter targets -> their rank, in model order."""
    unservable = [name for name in others if config.targets(name)]
    if unservable:
        raise LoRALoadError(f"{CONFIG_FILE}: target modules {_summary(unservable)} cannot be served: LoRA applies "
                            "only to the q/k/v/o/gate/up/down projections")
    ranks = {name: config.rank(name) for name in shards if config.targets(name)}
    if not ranks:
        raise LoRALoadError(f"{CONFIG_FILE}: target_modules {config.target_modules!r} match no projection "
                            "of the model")
    return ranks


def _summary(names: list[str], limit: int = 8) -> str:
    """Names with layer indices collapsed ("model.layers.N.mlp"), at most `limit` of them."""
    unique = list(dict.fromkeys(re.sub(r"\.\d+(?=\.|$)", ".N", name) for name in names))
    return ", ".join(unique[:limit]) + (", ..." if len(unique) > limit else "")


def _check_ranks(ranks: dict[str, int], max_rank: int) -> None:
    name, rank = max(ranks.items(), key=lambda item: item[1])
    if rank > max_rank:
        raise LoRALoadError(f"rank {rank} (at {name}) exceeds max_lora_rank {max_rank}")


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    file = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), None)
    if file is None:
        raise LoRALoadError(f"no adapter weights in the directory ({' or '.join(WEIGHT_FILES)})")
    try:
        if file.suffix == ".safetensors":
            tensors = load_file(file)
        else:
            tensors = torch.load(file, map_location="cpu", weights_only=True)
    except (SafetensorError, pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise LoRALoadError(f"{file.name} cannot be read ({e})") from None
    if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise LoRALoadError(f"{file.name} is not a mapping of tensor names to tensors")
    return tensors


def _pair(tensors: dict[str, torch.Tensor], ranks: dict[str, int],
          shards: dict[str, _Shard]) -> dict[str, tuple[tuple[str, torch.Tensor], tuple[str, torch.Tensor]]]:
    """Each targeted HF projection -> its ((A name, A), (B name, B)), in model order."""
    found: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}
    for key, tensor in tensors.items():
        match = KEY.fullmatch(key)
        if match is None or match["module"] not in ranks:
            raise LoRALoadError(_unmapped(key, match, shards))
        slot = found.setdefault(match["module"], {})
        if match["kind"] in slot:
            raise LoRALoadError(f"tensors {slot[match['kind']][0]!r} and {key!r} are both "
                                f"{match['kind']} of {match['module']}")
        slot[match["kind"]] = (key, tensor)
    missing = [f"base_model.model.{name}.{kind}.weight" for name in ranks
               for kind in ("lora_A", "lora_B") if kind not in found.get(name, {})]
    if missing:
        raise LoRALoadError(f"missing tensors for modules target_modules selects: {', '.join(missing[:8])}"
                            + (", ..." if len(missing) > 8 else ""))
    return {name: (found[name]["lora_A"], found[name]["lora_B"]) for name in ranks}


def _unmapped(key: str, match: re.Match | None, shards: dict[str, _Shard]) -> str:
    if match is None:
        return f"tensor {key!r} is not a LoRA weight (<module>.lora_A.weight or <module>.lora_B.weight)"
    if match["module"] in shards:
        return f"tensor {key!r} is for {match['module']}, which target_modules does not select"
    return f"tensor {key!r} maps to no projection of the model ({match['module']})"


def _check_tensor(key: str, tensor: torch.Tensor, shape: tuple[int, int], meaning: str) -> None:
    if tuple(tensor.shape) != shape:
        raise LoRALoadError(f"tensor {key!r} has shape {tuple(tensor.shape)}; the model needs {shape} "
                            f"({meaning})")
    if not tensor.is_floating_point():
        raise LoRALoadError(f"tensor {key!r} is {tensor.dtype}, not floating point")
