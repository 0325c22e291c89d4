"""Find a model (alias, HF-format directory, or GGUF file), convert GGUF once into a cached HF-format
directory, and build our model from it."""
import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from gdserve.distributed.parallel_state import get_tensor_model_parallel_world_size
from gdserve.layers.checkpoint import CheckpointTensor
from gdserve.layers.packed_linear import PackedLinear
from gdserve.layers.quantization import check_method
from gdserve.layers.rotary import RotaryEmbedding
from gdserve.models.config import ModelConfig
from gdserve.models.llama import LlamaForCausalLM
from gdserve.models.registry import ALIASES
from gdserve.quant.config import PackedQuantConfig, checkpoint_quant_config, packed_quant_config, resolve_method
from gdserve.quant.load import init_dummy_packed, load_packed_weights, packed_layout, packed_projections

logger = logging.getLogger(__name__)
LOAD_FORMATS = ("auto", "dummy")


def cache_root() -> Path:
    return Path(os.environ.get("GDSERVE_CACHE") or Path.home() / ".cache" / "gdserve")


def resolve_model(name: str) -> Path:
    """An alias, an HF-format directory or a .gguf file -> an HF-format directory
    (config.json, *.safetensors, tokenizer files)."""
    if name in ALIASES:
        return _converted(ALIASES[name].path())
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is not an HF-format model directory: no config.json")
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _converted(path)
    raise ValueError(f"unknown model {name!r}: expected an alias ({', '.join(ALIASES)}), "
                     "an HF-format directory (config.json + *.safetensors), or a .gguf file")


def source_gguf(name: str) -> Path | None:
    """The .gguf file a model name (an alias or a path) comes from; None for an HF-format directory."""
    if name in ALIASES:
        return ALIASES[name].path()
    path = Path(name).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def _gguf_key(gguf: Path) -> str:
    """Size plus the first and last MiB (header and metadata, and some tensor data): cheap,
    and stable when the same file is reinstalled elsewhere."""
    size = gguf.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with gguf.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(size - (1 << 20), 0))
        digest.update(f.read())
    return digest.hexdigest()[:16]


def _converted(gguf: Path) -> Path:
    out = cache_root() / f"{gguf.stem}-{_gguf_key(gguf)}"
    if out.is_dir():  # only ever created complete, by the rename below
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        logger.info("converting %s to an HF-format directory %s (once)", gguf, out)
        _export_hf_dir(gguf, tmp)
        tmp.chmod(0o755)  # mkdtemp made it private
        try:
            tmp.rename(out)
        except OSError:
            if not out.is_dir():
                raise  # else another process finished the same conversion first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _export_hf_dir(gguf: Path, dst: Path) -> None:
    from transformers import AutoModelForCausalLM  # heavy; only needed on first use of a GGUF

    # transformers dequantizes every tensor to fp32 (needs the gguf and accelerate packages).
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # save_pretrained refuses a "gguf-quantized" model, though its weights are plain fp32 now.
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(dst)  # config.json, model.safetensors, generation_config.json
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(dst)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               load_format: str = "auto", quantization: str | None = None,
               gguf_file: Path | None = None) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build our model from an HF-format directory. load_format "dummy" needs only config.json
    and fills deterministic random weights (benchmarks with real shapes). quantization (one of
    QUANTIZATIONS): "fp8" quantizes the loaded weights; "awq" / "gptq" (also found in config.json's
    quantization_config) and "gguf" (the weights then come from gguf_file, the model's source)
    keep the checkpoint's linear layers packed; with "dummy", random weights are quantized by
    round-to-nearest into the packed layout. In a tensor-parallel group (gdserve.distributed) the
    model is this rank's shard, and each rank reads only its slices of the checkpoint."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r}: expected one of {', '.join(LOAD_FORMATS)}")
    if quantization is not None:
        check_method(quantization)
    path = Path(path)
    hf_config = AutoConfig.from_pretrained(path)
    quant_config = checkpoint_quant_config(path, hf_config)
    method = resolve_method(quantization, quant_config, load_format, gguf_file is not None)
    if quantization == "fp8":
        _check_fp8(torch.device(device))
    config = ModelConfig.from_hf(hf_config)
    tp_size = get_tensor_model_parallel_world_size()
    config.check_tensor_parallel(tp_size)
    if method is not None and tp_size > 1:
        raise ValueError(f"packed {method} weights with tensor_parallel_size {tp_size} are not supported "
                         "yet: serve them on one device, or use unquantized or fp8 weights")
    if method is not None:
        quant = packed_quant_config(method, quant_config, load_format)
        return _load_packed(path, config, dtype, device, quant, gguf_file).eval(), config
    model = _build(config, dtype, device)
    if load_format == "dummy":
        _init_dummy(model)
    else:
        model.load_weights(_safetensors_weights(path, lazy=tp_size > 1))
    if quantization is not None:
        model.quantize(quantization)
    return model.eval(), config


def _load_packed(path: Path, config: ModelConfig, dtype: torch.dtype, device: str | torch.device,
                 quant: PackedQuantConfig, gguf_file: Path | None) -> LlamaForCausalLM:
    gguf = None
    if quant.method == "gguf" and not quant.rtn:
        from gdserve.quant.gguf import GGUFCheckpoint  # needs the gguf package, which the GPU image lacks
        gguf = GGUFCheckpoint(gguf_file)
    model = _build(config, dtype, device, packed_layout(quant, gguf.linear_layouts() if gguf else None))
    if quant.rtn:
        _init_dummy(model)
        init_dummy_packed(model)
    elif gguf is not None:
        load_packed_weights(model, gguf.weights(config.num_attention_heads, config.num_key_value_heads, dtype))
    else:
        load_packed_weights(model, packed_projections(_safetensors_weights(path), quant, dtype))
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.finish_loading()
    logger.info("linear layers packed (%s%s)", quant.method, ", random weights, round-to-nearest" if quant.rtn else "")
    return model


def _check_fp8(device: torch.device) -> None:
    if device.type == "cpu":
        logger.warning("quantization fp8 on the CPU halves the weights' memory but runs ~9x slower than "
                       "bfloat16 weights (torch's CPU fp8 GEMM)")
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if capability is not None and capability < (8, 9):
        major, minor = capability
        raise ValueError(f"quantization fp8 needs fp8 tensor cores (compute capability 8.9 or "
                         f"higher: Ada, Hopper); {torch.cuda.get_device_name(device)} is {major}.{minor}")


def _build(config: ModelConfig, dtype: torch.dtype, device: str | torch.device,
           packed: Callable[[str], tuple[int, int]] | None = None) -> LlamaForCausalLM:
    """Uninitialized weights: loading or dummy init fills them all, and a random init of
    SmolLM2 alone costs 1.6 s on CPU. packed: the layout of PackedLinears that take the linear
    layers' place before anything is allocated."""
    with torch.device("meta"), _default_dtype(dtype):
        model = LlamaForCausalLM(config)
        if packed is not None:
            model.pack_linears(packed)
    model.to_empty(device=device)
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_parameters()  # a computed cache, not a weight
    return model


def _safetensors_weights(path: Path, lazy: bool = False) -> Iterator[tuple[str, CheckpointTensor]]:
    """Each tensor by name; lazy: as a slice that reads only the part indexed (valid until the
    next one is taken)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_slice(name) if lazy else f.get_tensor(name)


@torch.no_grad()
def _init_dummy(model: LlamaForCausalLM, seed: int = 0) -> None:
    generator = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=generator)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path)


def load_eos_token_ids(path: str | Path, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The tokenizer's EOS plus generation_config.json's eos_token_id (an int or a list)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen_file = Path(path) / "generation_config.json"
    if gen_file.is_file():
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else eos or [])
    return ids
