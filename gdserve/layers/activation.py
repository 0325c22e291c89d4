import torch
from torch import nn

from gdserve.kernels import silu_and_mul


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2 * I] (gate then up) -> [T, I]"""
        return silu_and_mul(x)
