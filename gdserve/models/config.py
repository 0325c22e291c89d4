from dataclasses import dataclass
from typing import Any

from gdserve.quant.config import CHECKPOINT_METHODS

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # has "rope_type"; None for plain RoPE
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v projections
    o_proj_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None  # set only when some layer actually uses it

    @property
    def max_model_len_cap(self) -> int:
        """Longest context served exactly. We run full attention, which equals sliding-window
        attention as long as no sequence is longer than the window, so the engine caps
        max_model_len here."""
        return min(self.max_position_embeddings, self.sliding_window or self.max_position_embeddings)

    def check_tensor_parallel(self, size: int) -> None:
        """Refuse a tensor_parallel_size that does not split this model's heads and sizes evenly."""
        problems = [f"{n} {what}" for n, what in ((self.num_attention_heads, "attention heads"),
                                                  (self.intermediate_size, "MLP features (intermediate_size)"))
                    if n % size]
        kv = self.num_key_value_heads
        if kv % size and size % kv:
            problems.append(f"{kv} KV heads (neither divisible by it nor dividing it)")
        if problems:
            raise ValueError(f"{self.architecture}: tensor_parallel_size {size} does not divide the model's "
                             + ", ".join(problems))

    @classmethod
    def from_hf(cls, hf: Any) -> "ModelConfig":
        """From a transformers config (4.x `rope_theta`/`rope_scaling` or 5.x `rope_parameters`)."""
        arch = _architecture(hf)
        quant = getattr(hf, "quantization_config", None)
        method = (quant.get("quant_method", "?") if isinstance(quant, dict) else type(quant).__name__) if quant else None
        if method is not None and method not in CHECKPOINT_METHODS:
            raise ValueError(f"{arch}: checkpoints quantized ahead of time with quant_method {method!r} are not "
                             f"supported (only {', '.join(CHECKPOINT_METHODS)}); load the unquantized checkpoint "
                             "with quantization='fp8' (--quantization fp8) to quantize it at load")
        if getattr(hf, "hidden_act", "silu") != "silu":
            raise ValueError(f"{arch}: hidden_act {hf.hidden_act!r} is not supported (only 'silu')")
        is_qwen2 = arch == "Qwen2ForCausalLM"
        attention_bias = getattr(hf, "attention_bias", False)
        rope_theta, rope_scaling = _rope(hf)
        return cls(
            architecture=arch,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_hidden_layers=hf.num_hidden_layers,
            num_attention_heads=hf.num_attention_heads,
            num_key_value_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
            rms_norm_eps=hf.rms_norm_eps,
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            attention_bias=is_qwen2 or attention_bias,
            o_proj_bias=not is_qwen2 and attention_bias,
            mlp_bias=getattr(hf, "mlp_bias", False),
            sliding_window=_sliding_window(hf),
        )


def _architecture(hf: Any) -> str:
    archs = getattr(hf, "architectures", None) or []
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    raise ValueError(f"unsupported architecture {archs or None}; "
                     f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def _rope(hf: Any) -> tuple[float, dict[str, Any] | None]:
    params = getattr(hf, "rope_parameters", None)  # transformers 5: theta and scaling in one dict
    if params is None:
        params = {"rope_theta": getattr(hf, "rope_theta", 10000.0),
                  **(getattr(hf, "rope_scaling", None) or {})}
    params = dict(params)
    theta = float(params.pop("rope_theta", 10000.0))
    legacy_type = params.pop("type", None)  # transformers < 4.45
    rope_type = params.pop("rope_type", None) or legacy_type or "default"
    if rope_type == "default":
        return theta, None
    return theta, {"rope_type": rope_type, **params}


def _sliding_window(hf: Any) -> int | None:
    window = getattr(hf, "sliding_window", None)
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is not None:
        used = "sliding_attention" in layer_types
    else:
        used = getattr(hf, "use_sliding_window", True)  # Mistral has no switch: set means used
    return window if used and window else None
