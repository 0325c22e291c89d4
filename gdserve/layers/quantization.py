"""Weight quantization applied after loading (`--quantization`): the model's linear layers, the
LM head apart (as vLLM keeps it), swap their weights for quantized ones."""
from typing import NamedTuple

import torch
from torch import nn

from gdserve.distributed.communication_op import tensor_model_parallel_all_reduce
from gdserve.kernels.fp8_gemm import fp8_gemm
from gdserve.kernels.quant import quant_fp8_rowwise
from gdserve.layers.linear import RowParallelLinear

# fp8: quantized after loading (here). awq, gptq, gguf: loaded packed from a checkpoint in that
# format (gdserve.quant, PackedLinear)
QUANTIZATIONS = ("fp8", "awq", "gptq", "gguf")


class Fp8Activation(NamedTuple):
    """An activation already quantized for an Fp8Linear (by the norm or activation before it, in
    the same kernel): q [T, K] float8_e4m3fn, scale [T, 1] float32."""
    q: torch.Tensor
    scale: torch.Tensor


class Fp8Linear(nn.Module):
    """W8A8 fp8, dynamic: the weight in float8_e4m3fn with one scale per output channel, each
    input row quantized the same way on the fly, and the GEMM on fp8 tensor cores (sm_89 and
    up; on the CPU torch's own _scaled_mm): half the weight bytes of bf16, twice the FLOP rate."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.shard_sizes = getattr(linear, "shard_sizes", None)  # a fused projection's, for LoRA
        weight, scale = quant_fp8_rowwise(linear.weight.detach())
        self.weight = nn.Parameter(weight, requires_grad=False)              # [N, K]
        self.weight_scale = nn.Parameter(scale.t().contiguous(), requires_grad=False)  # [1, N]
        self.bias = linear.bias
        self.out_dtype = linear.weight.dtype

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        if isinstance(x, Fp8Activation):
            out = fp8_gemm(x.q, x.scale, self.weight, self.weight_scale, self.out_dtype)
        else:
            out = fp8_gemm(*quant_fp8_rowwise(x.reshape(-1, self.in_features)), self.weight, self.weight_scale,
                           self.out_dtype).view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class Fp8RowParallelLinear(Fp8Linear):
    """A RowParallelLinear in fp8: the same all-reduce after the GEMM (the bias is rank 0's alone)."""

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        return tensor_model_parallel_all_reduce(super().forward(x))


def quantize_linears(model: nn.Module, method: str, skip: tuple[nn.Module, ...] = ()) -> None:
    """Replace, in place, every nn.Linear of model that is not in skip."""
    check_method(method)
    if method != "fp8":
        raise ValueError(f"quantization {method!r} comes with the checkpoint (load_model); only fp8 "
                         "quantizes a loaded model")
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and not any(child is s for s in skip)]
    for _, name, linear in targets:  # all checked before any is replaced
        _check_fp8_shape(name, linear)
    for parent, name, linear in targets:
        setattr(parent, name, (Fp8RowParallelLinear if isinstance(linear, RowParallelLinear) else Fp8Linear)(linear))


def check_method(method: str) -> None:
    if method not in QUANTIZATIONS:
        raise ValueError(f"quantization {method!r}: expected one of {', '.join(QUANTIZATIONS)}")


def _check_fp8_shape(name: str, linear: nn.Linear) -> None:
    # torch._scaled_mm (CUTLASS, cuBLASLt) takes fp8 operands whose dims are multiples of 16.
    if linear.in_features % 16 or linear.out_features % 16:
        raise ValueError(f"quantization fp8 needs linear layers whose dims are multiples of 16; "
                         f"{name} is {linear.out_features} x {linear.in_features}")
