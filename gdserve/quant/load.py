"""Load a model whose linear layers are PackedLinears: each format's checkpoint tensors become one
PackedProjection per projection; everything else loads as dense weights."""
from collections.abc import Callable, Iterable, Iterator

import torch

from gdserve.layers.packed_linear import PackedLinear
from gdserve.quant.awq import awq_to_packed
from gdserve.quant.config import PackedProjection, PackedQuantConfig
from gdserve.quant.gptq import gptq_to_packed
from gdserve.quant.rtn import rtn_quantize

Weights = Iterable[tuple[str, torch.Tensor]]
_PARTS = {"awq": ("qweight", "qzeros", "scales"), "gptq": ("qweight", "qzeros", "scales", "g_idx")}


def packed_layout(quant: PackedQuantConfig,
                  layouts: dict[str, tuple[int, int]] | None = None) -> Callable[[str], tuple[int, int]]:
    """(bits, group_size) of a checkpoint projection by its HF module name: the config's, or each
    projection's own (a GGUF's layouts)."""
    if layouts is None:
        return lambda name: (quant.bits, quant.group_size)

    def from_file(name: str) -> tuple[int, int]:
        if name not in layouts:
            raise ValueError(f"the GGUF file has no weight for {name}")
        return layouts[name]
    return from_file


def packed_projections(weights: Weights, quant: PackedQuantConfig,
                       dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor | PackedProjection]]:
    """An AWQ or GPTQ checkpoint's tensors: each projection's parts (qweight, qzeros, scales, and
    GPTQ's g_idx) gathered into one PackedProjection under its module's name; the rest as they are."""
    parts, pending = _PARTS[quant.method], {}
    for name, tensor in weights:
        module, _, part = name.rpartition(".")
        if part not in parts:
            yield name, tensor
            continue
        pending.setdefault(module, {})[part] = tensor
        if len(pending[module]) == len(parts):
            yield module, _convert(quant, pending.pop(module), dtype)
    for module, got in pending.items():  # g_idx is optional
        missing = [part for part in _PARTS["awq"] if part not in got]
        if missing:
            raise ValueError(f"checkpoint lacks {', '.join(f'{module}.{part}' for part in missing)}")
        yield module, _convert(quant, got, dtype)


def _convert(quant: PackedQuantConfig, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> PackedProjection:
    if quant.method == "awq":
        return PackedProjection(awq_to_packed(parts["qweight"], parts["qzeros"], parts["scales"],
                                              quant.group_size, dtype))
    return gptq_to_packed(parts["qweight"], parts["qzeros"], parts["scales"], parts.get("g_idx"),
                          quant.bits, quant.group_size, quant.zero_offset, dtype)


def load_packed_weights(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor | PackedProjection]]) -> None:
    """Copy a checkpoint in: PackedProjections into the model's PackedLinears, dense tensors through
    model.load_weights. Every projection must come exactly once."""
    expected, loaded = model.packed_projection_names(), set()

    def dense() -> Weights:
        for name, item in weights:
            if not isinstance(item, PackedProjection):
                yield name, item
                continue
            if name not in expected:
                raise ValueError(f"unexpected quantized weight {name!r} for {model.config.architecture}")
            if name in loaded:
                raise ValueError(f"quantized weight {name!r} appears twice in the checkpoint")
            model.load_packed(name, item.weight, item.perm)
            loaded.add(name)

    model.load_weights(dense())
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} quantized weights: {', '.join(missing[:8])}"
                         + (", ..." if len(missing) > 8 else ""))


@torch.no_grad()
def init_dummy_packed(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights of a dense model's scale (normal, std 0.02), quantized by round-to-nearest."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            generator = torch.Generator(device=module.qweight.device).manual_seed(seed)
            for index, out_features in enumerate(module.shard_sizes):
                dense = torch.empty(module.in_features, out_features, device=module.qweight.device)
                dense.normal_(0.0, 0.02, generator=generator)
                module.load_shard(index, rtn_quantize(dense, module.bits, module.group_size, module.scales.dtype))
            seed += 1
