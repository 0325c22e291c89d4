"""Which packed format a checkpoint is in, and its parameters, from config.json's
`quantization_config` (as vLLM reads it) or from the `quantization` argument."""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gdserve.kernels.packed_gemm import PackedWeight

PACKED_METHODS = ("awq", "gptq", "gguf")
CHECKPOINT_METHODS = ("awq", "gptq")  # the quant_method values of config.json we load
DUMMY_GROUP_SIZE = {"awq": 128, "gptq": 128, "gguf": 32}  # random weights, round-to-nearest at 4 bits
_QUANT_CONFIG_FILES = ("quantize_config.json", "quant_config.json")  # older AutoGPTQ / AutoAWQ


@dataclass(frozen=True)
class PackedQuantConfig:
    method: str          # awq | gptq | gguf (gguf: bits and groups come with each tensor)
    bits: int = 4
    group_size: int = 128  # -1: one group over all of in_features (GPTQ per-channel)
    # GPTQ's original checkpoint format ("gptq") stores each zero point minus 1; "gptq_v2" does not
    zero_offset: int = 0
    rtn: bool = False      # random weights quantized at load (load_format "dummy")


@dataclass
class PackedProjection:
    """One checkpoint projection, packed; perm: the input's column order it was stored in, if not
    plain (GPTQ desc_act)."""
    weight: PackedWeight
    perm: torch.Tensor | None = None


def checkpoint_quant_config(path: Path, hf_config: Any) -> dict | None:
    """config.json's quantization_config, else a quantize_config.json beside it (older GPTQ)."""
    quant = getattr(hf_config, "quantization_config", None)
    if quant is not None:
        return quant if isinstance(quant, dict) else quant.to_dict()
    for name in _QUANT_CONFIG_FILES:
        if (path / name).is_file():
            return json.loads((path / name).read_text())
    return None


def resolve_method(requested: str | None, quant: dict | None, load_format: str, has_gguf: bool) -> str | None:
    """The packed method to load with (None: none): the checkpoint's own quant_method, which a
    request may name but not contradict, else the requested one."""
    found = _quant_method(quant) if quant is not None else None
    if found is not None and requested is not None and requested != found:
        raise ValueError(f"quantization {requested!r} was requested, but the checkpoint is quantized with "
                         f"quant_method {found!r}")
    method = found or requested
    if method not in PACKED_METHODS:
        return None  # unquantized, or fp8 (quantized after load)
    if load_format == "dummy":
        return method
    if method == "gguf" and not has_gguf:
        raise ValueError("quantization 'gguf' needs a .gguf model (a file, or an alias of one)")
    if method in CHECKPOINT_METHODS and found is None:
        raise ValueError(f"quantization {method!r} needs a checkpoint quantized with it (quantization_config "
                         f"with quant_method {method!r} in config.json); this one has none. "
                         f"--load-format dummy quantizes random weights at load instead")
    return method


def packed_quant_config(method: str, quant: dict | None, load_format: str) -> PackedQuantConfig:
    if load_format == "dummy":
        return PackedQuantConfig(method, 4, DUMMY_GROUP_SIZE[method], rtn=True)
    if method == "awq":
        return _awq(quant)
    if method == "gptq":
        return _gptq(quant)
    return PackedQuantConfig("gguf")


def _quant_method(quant: dict) -> str:
    method = str(quant.get("quant_method", "")).lower()
    if method not in CHECKPOINT_METHODS:
        raise ValueError(f"checkpoints quantized with quant_method {method or None!r} are not supported "
                         f"(supported: {', '.join(CHECKPOINT_METHODS)})")
    return method


def _get(quant: dict, *keys: str, default: Any = None) -> Any:
    return next((quant[k] for k in keys if k in quant), default)


def _awq(quant: dict) -> PackedQuantConfig:
    bits, group_size = _get(quant, "w_bit", "bits"), _get(quant, "q_group_size", "group_size")
    version = str(_get(quant, "version", default="gemm")).lower()
    if bits != 4:
        raise ValueError(f"AWQ with {bits}-bit weights is not supported (4-bit only)")
    if version != "gemm":
        raise ValueError(f"AWQ version {version!r} is not supported: only the GEMM layout ('gemm')")
    if not _get(quant, "zero_point", default=True):
        raise ValueError("AWQ without zero points (zero_point: false) is not supported")
    if _get(quant, "modules_to_not_convert"):
        raise ValueError(f"AWQ modules_to_not_convert {quant['modules_to_not_convert']} is not supported")
    return PackedQuantConfig("awq", 4, _group_size(group_size))


def _gptq(quant: dict) -> PackedQuantConfig:
    bits, fmt = quant.get("bits"), str(quant.get("checkpoint_format", "gptq")).lower()
    if bits not in (4, 8):
        raise ValueError(f"GPTQ with {bits}-bit weights is not supported (4- or 8-bit)")
    if quant.get("is_marlin_format") or fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"GPTQ checkpoint_format {'marlin' if quant.get('is_marlin_format') else fmt!r} "
                         "is not supported ('gptq' or 'gptq_v2')")
    return PackedQuantConfig("gptq", bits, _group_size(quant.get("group_size")),
                             zero_offset=1 if fmt == "gptq" else 0)


def _group_size(group_size: Any) -> int:
    if not isinstance(group_size, int) or not (group_size > 0 or group_size == -1):
        raise ValueError(f"group_size {group_size!r}: expected a positive int, or -1 (per channel)")
    return group_size
