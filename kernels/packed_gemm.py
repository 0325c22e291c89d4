"""The packed-weight GEMM: x [M, K] times a 4-bit or 8-bit weight, dequantized in registers. Every
quantized format (AWQ, GPTQ, GGUF Q4_0/Q4_1/Q8_0) is repacked by its loader into PackedWeight."""
from dataclasses import dataclass

import torch

from gdserve.kernels import native
from gdserve.kernels.triton import use_triton

BITS = (4, 8)
# Rows up to which the CPU reads the packed weight directly (csrc/packed_gemm.c); above, blocks of
# K are dequantized and multiplied by torch (scripts/packed_gemm_cpu.py measures the crossover).
NATIVE_MAX_ROWS = 16
# Rows of K dequantized at a time on the CPU: a block of a few hundred kilobytes stays in cache.
DEQUANT_BLOCK_ELEMENTS = 1 << 18


@dataclass
class PackedWeight:
    """W [K, N] (in_features x out_features) quantized per group of `group_size` rows of K:
    W[k, n] = q[k, n] * scales[k // G, n] + biases[k // G, n], q unsigned in [0, 2**bits)."""
    qweight: torch.Tensor  # int32 [K * bits // 32, N]: q[k, n] in word k // (32 // bits), bits (k % (32 // bits)) * bits up
    scales: torch.Tensor  # [K // G, N], the activation dtype
    biases: torch.Tensor  # [K // G, N], same dtype (-zero_point * scale for AWQ/GPTQ, the min for Q4_1)
    bits: int
    group_size: int

    def __post_init__(self) -> None:
        _check_bits(self.bits)
        if self.qweight.dtype != torch.int32 or self.qweight.dim() != 2:
            raise ValueError(f"qweight must be a 2-D int32 tensor, got {self.qweight.dtype} {tuple(self.qweight.shape)}")
        K, N = self.in_features, self.out_features
        if self.group_size <= 0 or K % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide in_features {K}")
        groups = (K // self.group_size, N)
        for name in ("scales", "biases"):
            t = getattr(self, name)
            if tuple(t.shape) != groups:
                raise ValueError(f"{name} must have shape {groups} (K // group_size, N), got {tuple(t.shape)}")
            if not t.is_floating_point():
                raise ValueError(f"{name} must be floating point, got {t.dtype}")
        if self.biases.dtype != self.scales.dtype:
            raise ValueError(f"biases are {self.biases.dtype} but scales are {self.scales.dtype}")
        if len({self.qweight.device, self.scales.device, self.biases.device}) > 1:
            raise ValueError("qweight, scales and biases must be on one device")

    @property
    def in_features(self) -> int:
        return self.qweight.shape[0] * (32 // self.bits)

    @property
    def out_features(self) -> int:
        return self.qweight.shape[1]

    def dequantize(self) -> torch.Tensor:
        """W [K, N] in scales.dtype, computed in float32 and rounded once."""
        return _dequantize_rows(self, 0, self.in_features, self.scales.dtype)

    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.biases))


def _check_bits(bits: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits must be 4 or 8, got {bits}")


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q [K, N] of integers in [0, 2**bits) -> qweight int32 [K * bits // 32, N], low bits first."""
    _check_bits(bits)
    per_word = 32 // bits
    if q.dim() != 2 or q.is_floating_point() or q.is_complex():
        raise ValueError(f"q must be a 2-D integer tensor, got {q.dtype} {tuple(q.shape)}")
    if q.shape[0] % per_word:
        raise ValueError(f"K = {q.shape[0]} is not a multiple of {per_word} ({bits}-bit values per int32)")
    if q.numel() and (q.min().item() < 0 or q.max().item() >= 1 << bits):
        raise ValueError(f"q must lie in [0, {1 << bits}) for {bits} bits")
    K, N = q.shape
    shifts = torch.arange(per_word, device=q.device, dtype=torch.int64).view(1, per_word, 1) * bits
    words = (q.to(torch.int64).view(K // per_word, per_word, N) << shifts).sum(1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def unpack(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """qweight int32 [K * bits // 32, N] -> q uint8 [K, N]; pack's inverse."""
    _check_bits(bits)
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"qweight must be a 2-D int32 tensor, got {qweight.dtype} {tuple(qweight.shape)}")
    per_word = 32 // bits
    shifts = torch.arange(per_word, device=qweight.device, dtype=torch.int32).view(1, per_word, 1) * bits
    q = (qweight.unsqueeze(1) >> shifts) & ((1 << bits) - 1)
    return q.reshape(-1, qweight.shape[1]).to(torch.uint8)


def _dequantize_rows(w: PackedWeight, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows start:end of W, both multiples of the group size."""
    per_word, G, N = 32 // w.bits, w.group_size, w.out_features
    shifts = torch.arange(per_word, device=w.qweight.device, dtype=torch.int32).view(1, per_word, 1) * w.bits
    q = (w.qweight[start // per_word:end // per_word].unsqueeze(1) >> shifts) & ((1 << w.bits) - 1)
    q = q.view(-1, G, N).float()  # [groups, G, N]
    scales, biases = (t[start // G:end // G, None].float() for t in (w.scales, w.biases))
    return torch.addcmul(biases, q, scales).view(end - start, N).to(dtype)


def packed_gemm_reference(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """x @ w.dequantize(), float32 accumulation -> [M, N] in x.dtype."""
    _check_operands(x, w)
    return (x.float() @ w.dequantize().float()).to(x.dtype)


def _check_operands(x: torch.Tensor, w: PackedWeight) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.shape[1] != w.in_features:
        raise ValueError(f"x has {x.shape[1]} features but the weight has in_features {w.in_features}")
    if x.dtype != w.scales.dtype:
        raise ValueError(f"x is {x.dtype} but the weight's scales are {w.scales.dtype}")
    if x.device != w.qweight.device:
        raise ValueError(f"x is on {x.device} but the weight is on {w.qweight.device}")


def packed_gemm(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """packed_gemm_reference without dequantizing the whole weight: Triton on CUDA; on the CPU
    the native kernel for few rows, dequantized blocks of K and torch matmul for many."""
    _check_operands(x, w)
    if use_triton(x, "packed_gemm"):
        from gdserve.kernels.triton.packed_gemm import packed_gemm_triton
        return packed_gemm_triton(x.contiguous(), w.qweight.contiguous(), w.scales.contiguous(),
                                  w.biases.contiguous(), w.bits, w.group_size)
    if x.shape[0] <= NATIVE_MAX_ROWS:
        out = _packed_gemm_native(x, w)
        if out is not None:
            return out
    return _packed_gemm_blocked(x, w)


def _packed_gemm_native(x: torch.Tensor, w: PackedWeight) -> torch.Tensor | None:
    kernel = native.kernel("packed_gemm", x)
    if kernel is None:
        return None
    x, qweight, scales, biases = (t.contiguous() for t in (x, w.qweight, w.scales, w.biases))
    out = torch.empty(x.shape[0], w.out_features, dtype=x.dtype)
    kernel(native.ptr(x), native.ptr(qweight), native.ptr(scales), native.ptr(biases), native.ptr(out),
           x.shape[0], w.in_features, w.out_features, w.bits, w.group_size, torch.get_num_threads())
    return out


def _packed_gemm_blocked(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """Float32 sums over blocks of K, each block dequantized once: the whole weight in its float
    form is never held (4-8x the packed bytes)."""
    K, N = w.in_features, w.out_features
    block = max(w.group_size, DEQUANT_BLOCK_ELEMENTS // N // w.group_size * w.group_size)
    if block >= K:
        return (x.float() @ _dequantize_rows(w, 0, K, torch.float32)).to(x.dtype)
    xf = x.float()
    out = torch.zeros(x.shape[0], N, dtype=torch.float32, device=x.device)
    for start in range(0, K, block):
        end = min(start + block, K)
        out.addmm_(xf[:, start:end], _dequantize_rows(w, start, end, torch.float32))
    return out.to(x.dtype)
