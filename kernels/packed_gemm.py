"""The packed-weight GEMM: x [M, K] times a 4-bit or 8-bit weight, dequantized in registers. Every
quantized format (AWQ, GPTQ, GGUF Q4_0/Q4_1/Q8_0) is repacked by its loader into PackedWeight;
on CUDA, 4-bit weights may be reordered once more, into the tensor-core layout (to_mma,
cuda_packed_layout)."""
import os
from dataclasses import dataclass

import torch

from gdserve.kernels import native
from gdserve.kernels.triton import use_triton

BITS = (4, 8)
LAYOUTS = ("rows", "mma")
# Rows up to which the CPU reads the packed weight directly (csrc/packed_gemm.c); above, blocks of
# K are dequantized and multiplied by torch (scripts/packed_gemm_cpu.py measures the crossover).
NATIVE_MAX_ROWS = 16
# Rows of K dequantized at a time on the CPU: a block of a few hundred kilobytes stays in cache.
DEQUANT_BLOCK_ELEMENTS = 1 << 18
# The mma layout's tile of K: 16 words of 4-bit codes a row of N.
MMA_TILE_K = 128
# Columns repacked at a time (bounds the int64 scratch to_mma needs).
MMA_REPACK_COLUMNS = 2048
# The layout CUDA loads 4-bit weights into where GDSERVE_PACKED_LAYOUT does not say: rows, as the
# mma kernel's default tiles are slower than the rows layout's kernels but near 16 rows
# (docs/benchmarks.md).
CUDA_PACKED_LAYOUT = "rows"


@dataclass
class PackedWeight:
    """W [K, N] (in_features x out_features) quantized per group of `group_size` rows of K:
    W[k, n] = q[k, n] * scales[k // G, n] + biases[k // G, n], q unsigned in [0, 2**bits).

    layout "rows": qweight int32 [K * bits // 32, N], q[k, n] in word k // (32 // bits) of
    column n, bits (k % (32 // bits)) * bits up. Layout "mma" (4-bit only, see to_mma): qweight
    int32 [N, ceil(K / 128) * 16], each row of N a run of 128-value tiles of K ordered so that
    the words a thread loads unpack straight into the tensor cores' operand registers."""
    qweight: torch.Tensor
    scales: torch.Tensor  # [K // G, N], the activation dtype
    biases: torch.Tensor  # [K // G, N], same dtype (-zero_point * scale for AWQ/GPTQ, the min for Q4_1)
    bits: int
    group_size: int
    layout: str = "rows"

    def __post_init__(self) -> None:
        _check_bits(self.bits)
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.layout == "mma" and self.bits != 4:
            raise ValueError(f"the mma layout holds 4-bit weights, got {self.bits}-bit")
        if self.qweight.dtype != torch.int32 or self.qweight.dim() != 2:
            raise ValueError(f"qweight must be a 2-D int32 tensor, got {self.qweight.dtype} {tuple(self.qweight.shape)}")
        if self.group_size <= 0:
            raise ValueError(f"group_size must be positive, got {self.group_size}")
        K, N = self.in_features, self.out_features
        if self.layout == "rows" and K % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide in_features {K}")
        groups = (K // self.group_size if self.layout == "rows" else self.scales.shape[0], N)
        for name in ("scales", "biases"):
            t = getattr(self, name)
            if tuple(t.shape) != groups:
                raise ValueError(f"{name} must have shape {groups} (K // group_size, N), got {tuple(t.shape)}")
            if not t.is_floating_point():
                raise ValueError(f"{name} must be floating point, got {t.dtype}")
        if self.biases.dtype != self.scales.dtype:
            raise ValueError(f"biases are {self.biases.dtype} but scales are {self.scales.dtype}")
        if self.layout == "mma" and tuple(self.qweight.shape) != _mma_shape(K, N):
            raise ValueError(f"qweight must have shape {_mma_shape(K, N)} in the mma layout for "
                             f"{K} x {N} (in x out), got {tuple(self.qweight.shape)}")
        if len({self.qweight.device, self.scales.device, self.biases.device}) > 1:
            raise ValueError("qweight, scales and biases must be on one device")

    @property
    def in_features(self) -> int:
        if self.layout == "rows":
            return self.qweight.shape[0] * (32 // self.bits)
        return self.scales.shape[0] * self.group_size

    @property
    def out_features(self) -> int:
        return self.qweight.shape[1] if self.layout == "rows" else self.qweight.shape[0]

    def codes(self) -> torch.Tensor:
        """q [K, N] uint8, in either layout."""
        if self.layout == "rows":
            return unpack(self.qweight, self.bits)
        return _codes_from_mma(self.qweight, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """W [K, N] in scales.dtype, computed in float32 and rounded once."""
        return _dequantize_rows(to_rows(self), 0, self.in_features, self.scales.dtype)

    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.biases))


def _mma_shape(K: int, N: int) -> tuple[int, int]:
    return (N, -(-K // MMA_TILE_K) * MMA_TILE_K // 8)


def to_mma(w: PackedWeight) -> PackedWeight:
    """The same 4-bit weight in the mma layout (the CUDA kernels' own, made once at load time).

    A tensor-core multiply (mma / wgmma, 16-bit operands) takes its first operand from registers:
    in each 16-wide slice of K, the thread of lane l holds k = 2t, 2t + 1, 2t + 8, 2t + 9
    (t = l % 4) of its rows. The kernel computes out^T = W^T x^T, so W's rows of N are that
    operand, and a tile of 128 values of K is stored as 4 x 4 words per row: word (t, w) holds,
    in its nibbles p = 4 e + 2 c + a, the codes of k = 32 w + 16 e + 8 c + 2 t + a. Thread t's
    four words are adjacent (one 16-byte load) and unpack, by masks and shifts alone, into the
    32 values it multiplies. K is padded with zero codes to a whole tile."""
    if w.layout == "mma":
        return w
    if w.bits != 4:
        raise ValueError(f"the mma layout holds 4-bit weights, got {w.bits}-bit")
    q = w.codes()
    K, N = q.shape
    words = torch.cat([_mma_words(q[:, n:n + MMA_REPACK_COLUMNS]) for n in range(0, N, MMA_REPACK_COLUMNS)])
    return PackedWeight(words, w.scales, w.biases, 4, w.group_size, "mma")


def _mma_words(q: torch.Tensor) -> torch.Tensor:
    """Codes q [K, N] -> the mma layout's words [N, ceil(K / 128) * 16]."""
    (K, N), tiles = q.shape, -(-q.shape[0] // MMA_TILE_K)
    padded = torch.zeros(N, tiles * MMA_TILE_K, dtype=torch.int64, device=q.device)
    padded[:, :K] = q.t()
    # [n, tile, w, e, c, t, a] -> [n, tile, t, w, (e c a) = nibble]
    nibbles = padded.view(N, tiles, 4, 2, 2, 4, 2).permute(0, 1, 5, 2, 3, 4, 6).reshape(N, tiles * 16, 8)
    shifts = torch.arange(8, device=q.device, dtype=torch.int64) * 4
    return _to_int32((nibbles << shifts).sum(-1))


def cuda_packed_layout() -> str:
    """The layout of 4-bit weights where the Triton kernels run: GDSERVE_PACKED_LAYOUT (rows or
    mma), else CUDA_PACKED_LAYOUT."""
    layout = os.environ.get("GDSERVE_PACKED_LAYOUT") or CUDA_PACKED_LAYOUT
    if layout not in LAYOUTS:
        raise ValueError(f"GDSERVE_PACKED_LAYOUT={layout!r}: expected one of {', '.join(LAYOUTS)}")
    return layout


def device_layout(w: PackedWeight) -> PackedWeight:
    """The layout the weight's device multiplies fastest: cuda_packed_layout() for 4-bit weights
    where the Triton kernels run, rows elsewhere (the CPU's native kernel, 8-bit weights)."""
    if w.bits == 4 and use_triton(w.qweight, "packed_gemm") and cuda_packed_layout() == "mma":
        return to_mma(w)
    return to_rows(w)


def to_rows(w: PackedWeight) -> PackedWeight:
    """to_mma's inverse (the rows layout is returned as it is)."""
    if w.layout == "rows":
        return w
    return PackedWeight(pack(w.codes(), w.bits), w.scales, w.biases, w.bits, w.group_size)


def _codes_from_mma(qweight: torch.Tensor, K: int) -> torch.Tensor:
    N, tiles = qweight.shape[0], qweight.shape[1] // 16
    shifts = torch.arange(8, device=qweight.device, dtype=torch.int32) * 4
    nibbles = (qweight.unsqueeze(-1) >> shifts) & 0xF  # [n, tile * 16 + 4 t + w, nibble]
    q = nibbles.view(N, tiles, 4, 4, 2, 2, 2).permute(0, 1, 3, 4, 5, 2, 6).reshape(N, tiles * MMA_TILE_K)
    return q[:, :K].t().to(torch.uint8)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2**32) -> the int32 of the same bits."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


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
    return _to_int32((q.to(torch.int64).view(K // per_word, per_word, N) << shifts).sum(1))


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
    """packed_gemm_reference without dequantizing the whole weight: Triton on CUDA (the mma
    layout's kernel for 4-bit weights); on the CPU the native kernel for few rows, dequantized
    blocks of K and torch matmul for many."""
    _check_operands(x, w)
    if w.layout == "mma" and use_triton(x, "packed_gemm"):
        from gdserve.kernels.triton.packed_gemm_mma import packed_gemm_mma_triton
        return packed_gemm_mma_triton(x.contiguous(), w.qweight.contiguous(), w.scales.contiguous(),
                                      w.biases.contiguous(), w.group_size)
    w = to_rows(w)  # the CPU's kernels read the rows layout
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
