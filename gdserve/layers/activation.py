import torch
from torch import nn

from gdserve.kernels import silu_and_mul
from gdserve.kernels.activation import silu_and_mul_quant_fp8
from gdserve.layers.quantization import Fp8Activation


class SiluAndMul(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant_fp8 = False  # set when an Fp8Linear alone reads the output: it comes quantized

    def forward(self, x: torch.Tensor) -> torch.Tensor | Fp8Activation:
        """x: [T, 2 * I] (gate then up) -> [T, I]"""
        return Fp8Activation(*silu_and_mul_quant_fp8(x)) if self.quant_fp8 else silu_and_mul(x)
