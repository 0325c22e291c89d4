import torch
from torch import nn

from gdserve.kernels import rms_norm
from gdserve.layers.quantization import Fp8Activation


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.quant_fp8 = False  # set when an Fp8Linear alone reads the output: it comes quantized

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: norm(x). With it: (norm(x + residual), x + residual); the residual
        tensor may be updated in place. norm(x) is an Fp8Activation with quant_fp8."""
        if not self.quant_fp8:
            return rms_norm(x, self.weight, self.eps, residual)
        out = rms_norm(x, self.weight, self.eps, residual, quant_fp8=True)
        return Fp8Activation(*out) if residual is None else (Fp8Activation(*out[0]), out[1])
