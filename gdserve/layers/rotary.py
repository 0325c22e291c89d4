import math
from typing import Any

import torch
from torch import nn

from gdserve.kernels import apply_rotary  # noqa: F401  (re-exported: the model rotates through it)

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: low frequencies slowed by `factor`, high ones kept, a smooth blend between."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                  device: torch.device | None = None) -> torch.Tensor:
    """[D / 2] float32 inverse frequencies, computed as transformers does."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    rope_type = scaling["rope_type"] if scaling else "default"
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"unsupported rope_scaling type {rope_type!r}; "
                     f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float,
                 scaling: dict[str, Any] | None = None):
        super().__init__()
        self.head_dim, self.max_position = head_dim, max_position
        self.theta, self.scaling = theta, scaling
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """(Re)compute the float32 cos/sin cache on its device, e.g. after to_empty()."""
        device = self.cos.device
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling, device)
        positions = torch.arange(self.max_position, dtype=torch.float32, device=device)
        freqs = positions[:, None] * inv_freq[None, :]  # [P, D / 2]
        self.cos, self.sin = freqs.cos(), freqs.sin()

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> (cos, sin), each [T, 1, D / 2] in dtype: computed once per forward,
        shared by every layer's apply_rotary."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]
