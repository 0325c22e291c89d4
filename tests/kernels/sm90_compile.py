"""Compiles the GPU path's Triton kernels for the H200 (sm_90) on a machine without a GPU: triton's
CUDA backend and the ptxas it bundles run anywhere. The interpreter (the other kernel tests, in CI)
checks what a kernel computes, not whether the compiler takes it, and some code runs there that the
compiler refuses (a float constexpr in an `if`; a function whose returns differ in shape under a
constexpr `if`): those fail here instead of on the device. Each case calls a public wrapper on
small CPU tensors of the engine's dtypes and head sizes, with the launch turned into a compile.

Run as a script in a process where TRITON_INTERPRET is unset (the interpreter replaces triton.jit
when triton is imported): `python tests/kernels/sm90_compile.py [CASE ...]` prints one JSON line
per case, {"case", "ok", "error", "shared"} (shared: each compiled kernel's shared memory, bytes)."""
import json
import sys
from collections.abc import Callable

import torch

BF16, FP32 = torch.bfloat16, torch.float32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
KV_DTYPES = {"bf16": BF16, "e4m3": E4M3, "e5m2": E5M2}


class CompileOnlyDriver:
    """Stands in for triton's CUDA driver: device 0 is an sm_90 GPU, and there is no stream."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self.target


SHARED_MEMORY_LIMIT = 232448  # bytes a block may use on an H100 / H200 (cudaDevAttrMaxSharedMemoryPerBlockOptin)


def install_compile_only() -> list:
    """Every Triton launch compiles (for sm_90) and returns without running; returns the list the
    compiled kernels are appended to, as (name, shared memory bytes)."""
    import triton
    from triton.runtime.jit import JITFunction
    triton.runtime.driver.set_active(CompileOnlyDriver())
    run = JITFunction.run
    compiled = []

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel.metadata.shared))
        return kernel

    JITFunction.run = compile_only
    return compiled


def _paged_inputs(head_dim: int, num_heads: int, num_kv_heads: int, dtype: torch.dtype,
                  kv_dtype: torch.dtype, num_seqs: int = 4, page: int = 16, pages_per_seq: int = 4):
    q = torch.zeros(num_seqs, num_heads, head_dim, dtype=dtype)
    k_cache = torch.zeros(num_seqs * pages_per_seq, page, num_kv_heads, head_dim, dtype=kv_dtype)
    tables = torch.arange(num_seqs * pages_per_seq, dtype=torch.int32).view(num_seqs, pages_per_seq)
    lens = torch.full((num_seqs,), page * pages_per_seq, dtype=torch.int32)
    return q, k_cache, k_cache.clone(), tables, lens


def decode(head_dim: int, kv: str, split: bool, dtype: torch.dtype = BF16) -> None:
    from gdserve.kernels.triton.paged_attention import decode_attention_triton
    kv_dtype = dtype if kv == "model" else KV_DTYPES[kv]
    q, k_cache, v_cache, tables, lens = _paged_inputs(head_dim, 32, 8, dtype, kv_dtype)
    max_len = int(lens.max())
    decode_attention_triton(q, k_cache, v_cache, tables, lens, max_len, head_dim ** -0.5,
                            partition_size=max_len // 2 if split else max_len)


def prefill(head_dim: int, kv: str, dtype: torch.dtype = BF16, fp8_math: bool = False) -> None:
    from gdserve.kernels.triton.paged_attention import prefill_attention_triton
    kv_dtype = dtype if kv == "model" else KV_DTYPES[kv]
    _, k_cache, v_cache, tables, lens = _paged_inputs(head_dim, 32, 8, dtype, kv_dtype)
    q = torch.zeros(int(lens.sum()), 32, head_dim, dtype=dtype)
    starts = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0, dtype=torch.int32)])
    prefill_attention_triton(q, k_cache, v_cache, tables, lens, starts, int(lens.max()), head_dim ** -0.5,
                             torch.empty_like(q), fp8_math=fp8_math)


def write_kv(kv: str, dtype: torch.dtype = BF16) -> None:
    from gdserve.kernels.triton.kv_cache import write_kv_cache_triton
    key = torch.zeros(8, 8, 128, dtype=dtype)
    k_cache = torch.zeros(4, 16, 8, 128, dtype=dtype if kv == "model" else KV_DTYPES[kv])
    write_kv_cache_triton(key, key.clone(), k_cache, k_cache.clone(), torch.arange(8))


def bitmask(dtype: torch.dtype, indexed: bool) -> None:
    from gdserve.kernels.triton.bitmask import apply_token_bitmask_triton
    logits = torch.zeros(4, 49152, dtype=dtype)
    apply_token_bitmask_triton(logits, torch.zeros(4, 49152 // 32, dtype=torch.int32),
                               torch.arange(4, dtype=torch.int32) if indexed else None)


def gumbel_argmax(dtype: torch.dtype) -> None:
    from gdserve.kernels.sampling import NOISE_BLOCK
    from gdserve.kernels.triton.sampling import gumbel_argmax_triton
    gumbel_argmax_triton(torch.zeros(4, 128256, dtype=dtype), torch.ones(4), torch.zeros(4, dtype=torch.int64),
                         NOISE_BLOCK)


def rms_norm(hidden: int, residual: bool, dtype: torch.dtype = BF16, quant_fp8: bool = False) -> None:
    from gdserve.kernels.triton.rms_norm import rms_norm_triton
    x = torch.zeros(4, hidden, dtype=dtype)
    rms_norm_triton(x, torch.ones(hidden, dtype=dtype), 1e-5, x.clone() if residual else None, quant_fp8)


def rotary(head_dim: int, dtype: torch.dtype = BF16, rotate: bool = False) -> None:
    from gdserve.kernels.triton.rotary import apply_rotary_triton
    cos = torch.ones(4, 1, head_dim // 2, dtype=dtype)
    rotation = torch.eye(head_dim, dtype=dtype) if rotate else None
    apply_rotary_triton(torch.zeros(4, 32, head_dim, dtype=dtype), cos, cos.clone(), rotation)


def silu_and_mul(dtype: torch.dtype = BF16, quant_fp8: bool = False) -> None:
    from gdserve.kernels.triton.activation import silu_and_mul_quant_fp8_triton, silu_and_mul_triton
    (silu_and_mul_quant_fp8_triton if quant_fp8 else silu_and_mul_triton)(torch.zeros(4, 2 * 14336, dtype=dtype))


def quant_fp8(cols: int, dtype: torch.dtype = BF16) -> None:
    from gdserve.kernels.triton.quant import quant_fp8_rowwise_triton
    quant_fp8_rowwise_triton(torch.zeros(4, cols, dtype=dtype))


def fp8_gemm(rows: int, config: tuple | None = None) -> None:
    from gdserve.kernels.triton.fp8_gemm import fp8_gemm_triton
    from gdserve.kernels.triton.fp8_gemm_configs import TUNED_SM90
    fp8 = torch.float8_e4m3fn
    configs = [config] if config else sorted({c for table in TUNED_SM90.values() for c in table.values()}) or \
        [(64, 64, 256, 1, 4, 3)]
    a, w = torch.zeros(rows, 4096, dtype=fp8), torch.zeros(6144, 4096, dtype=fp8)
    for c in configs:
        fp8_gemm_triton(a, torch.ones(rows, 1), w, torch.ones(1, 6144), BF16, c)


# Llama-3-8B's LoRA-wrapped layers: (K, shard sizes) of qkv_proj, o_proj, gate_up_proj, down_proj.
LORA_LAYERS = {"qkv": (4096, (4096, 1024, 1024)), "o": (4096, (4096,)), "gate-up": (4096, (14336, 14336)),
               "down": (14336, (4096,))}


def lora(layer: str, rank: int, tokens: int, dtype: torch.dtype = BF16, split_k: int | None = None) -> None:
    """The shrink and expand kernels with the tiles the default path picks for `tokens`."""
    from gdserve.kernels.lora import LoRAMapping
    from gdserve.kernels.triton.lora import expand, shrink
    k, shard_sizes = LORA_LAYERS[layer]
    n = sum(shard_sizes)
    x, y = torch.zeros(tokens, k, dtype=dtype), torch.zeros(tokens, n, dtype=dtype)
    lora_a = torch.zeros(4, len(shard_sizes), rank, k, dtype=dtype)
    lora_b = torch.zeros(4, n, rank, dtype=dtype)
    groups = LoRAMapping.build([t % 4 for t in range(tokens)], 4, torch.device("cpu")).groups
    expand(y, shrink(x, lora_a, groups, split_k=split_k), lora_b, shard_sizes, groups)


# (in_features, out_features) of Llama-3-8B's linear layers: qkv, o, gate_up, down
LLAMA3_8B_LINEAR = ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096))


def packed_gemm(rows: int, bits: int = 4, group_size: int = 128, dtype: torch.dtype = BF16,
                configs: list | None = None) -> None:
    """The fused kernels at each of Llama-3-8B's shapes: the given tiles, else the default path's
    for `rows` there (tuned or by rule)."""
    from gdserve.kernels.triton.packed_gemm import packed_gemm_triton
    from gdserve.kernels.triton.packed_gemm_configs import GEMV_MAX_ROWS, config_for, gemv_config_for
    choose = gemv_config_for if rows <= GEMV_MAX_ROWS else config_for
    for K, N in LLAMA3_8B_LINEAR:
        qweight = torch.zeros(K * bits // 32, N, dtype=torch.int32)
        scales = torch.zeros(K // group_size, N, dtype=dtype)
        x = torch.zeros(rows, K, dtype=dtype)
        for config in configs or [choose(rows, N, K, bits, group_size, torch.device("cpu"))]:
            packed_gemm_triton(x, qweight, scales, scales, bits, group_size, config)


def _packed_tuned() -> list:
    from gdserve.kernels.triton.packed_gemm_configs import TUNED_GEMV_SM90, TUNED_SM90
    return sorted({c for table in TUNED_SM90.values() for c in table.values()} | set(TUNED_GEMV_SM90.values()))


def packed_dequantize(bits: int, dtype: torch.dtype = BF16) -> None:
    from gdserve.kernels.triton.packed_gemm import dequantize_triton
    qweight = torch.zeros(4096 * bits // 32, 6144, dtype=torch.int32)
    scales = torch.zeros(4096 // 128, 6144, dtype=dtype)
    dequantize_triton(qweight, scales, scales, bits, 128)


def packed_gemm_mma(rows: int, group_size: int = 128, dtype: torch.dtype = BF16,
                    configs: list | None = None, shapes: tuple = LLAMA3_8B_LINEAR) -> None:
    """The mma layout's kernel at each of Llama-3-8B's shapes: the given tiles, else the default
    path's for `rows` (the fused kernel, or the dequantize kernel and cuBLAS)."""
    from gdserve.kernels.triton.packed_gemm_mma import packed_gemm_mma_triton
    for K, N in shapes:
        qweight = torch.zeros(N, -(-K // 128) * 16, dtype=torch.int32)
        scales = torch.zeros(K // group_size, N, dtype=dtype)
        x = torch.zeros(rows, K, dtype=dtype)
        for config in configs or [None]:
            packed_gemm_mma_triton(x, qweight, scales, scales, group_size, config)


def _cases() -> dict[str, Callable[[], None]]:
    cases = {}
    for head_dim in (64, 128):
        for kv in KV_DTYPES:
            cases[f"decode-d{head_dim}-{kv}"] = lambda d=head_dim, kv=kv: decode(d, kv, split=False)
            cases[f"prefill-d{head_dim}-{kv}"] = lambda d=head_dim, kv=kv: prefill(d, kv)
        cases[f"decode-split-d{head_dim}-bf16"] = lambda d=head_dim: decode(d, "bf16", split=True)
        cases[f"rotary-d{head_dim}"] = lambda d=head_dim: rotary(d)
        cases[f"rotary-rotate-d{head_dim}"] = lambda d=head_dim: rotary(d, rotate=True)
    for head_dim in (32, 256):  # the dispatcher takes any power of two from 16 up
        cases[f"decode-d{head_dim}-bf16"] = lambda d=head_dim: decode(d, "bf16", split=False)
        cases[f"prefill-d{head_dim}-bf16"] = lambda d=head_dim: prefill(d, "bf16")
    cases["prefill-d256-fp32"] = lambda: prefill(256, "model", dtype=FP32)  # the most shared memory
    cases["decode-split-d128-e4m3"] = lambda: decode(128, "e4m3", split=True)
    for head_dim in (64, 128, 256):  # fp8 attention math over an e4m3 cache
        cases[f"prefill-d{head_dim}-fp8-math"] = lambda d=head_dim: prefill(d, "e4m3", fp8_math=True)
    cases["decode-d128-fp32"] = lambda: decode(128, "model", split=False, dtype=FP32)
    cases["prefill-d128-fp32"] = lambda: prefill(128, "model", dtype=FP32)
    for kv in ("bf16", "e4m3", "e5m2"):
        cases[f"write-kv-{kv}"] = lambda kv=kv: write_kv(kv)
    cases["write-kv-fp32"] = lambda: write_kv("model", dtype=FP32)
    for dtype, name in ((FP32, "fp32"), (BF16, "bf16")):
        cases[f"bitmask-{name}"] = lambda dtype=dtype: bitmask(dtype, indexed=False)
    cases["bitmask-indexed-fp32"] = lambda: bitmask(FP32, indexed=True)
    for dtype, name in ((FP32, "fp32"), (BF16, "bf16")):
        cases[f"gumbel-argmax-{name}"] = lambda dtype=dtype: gumbel_argmax(dtype)
    for hidden in (576, 4096):
        cases[f"rms-norm-{hidden}"] = lambda h=hidden: rms_norm(h, residual=False)
        cases[f"rms-norm-residual-{hidden}"] = lambda h=hidden: rms_norm(h, residual=True)
    cases["silu-and-mul-bf16"] = silu_and_mul
    cases["rms-norm-quant-fp8-4096"] = lambda: rms_norm(4096, residual=False, quant_fp8=True)
    cases["rms-norm-residual-quant-fp8-4096"] = lambda: rms_norm(4096, residual=True, quant_fp8=True)
    cases["silu-and-mul-quant-fp8"] = lambda: silu_and_mul(quant_fp8=True)
    for cols in (4096, 14336):  # the GEMM inputs of Llama-3-8B: hidden, intermediate
        cases[f"quant-fp8-{cols}"] = lambda c=cols: quant_fp8(c)
    cases["quant-fp8-fp32"] = lambda: quant_fp8(576, FP32)
    cases["fp8-gemm-tuned"] = lambda: fp8_gemm(64)  # every tile the tuned table names
    cases["fp8-gemm-split-k"] = lambda: fp8_gemm(16, (16, 64, 256, 4, 4, 4))
    for layer in LORA_LAYERS:
        for rank in (16, 64):
            for tokens in (16, 1024):  # decode's tiles (split over K), prefill's
                cases[f"lora-{layer}-r{rank}-t{tokens}"] = lambda l=layer, r=rank, t=tokens: lora(l, r, t)
    cases["lora-qkv-r16-fp32"] = lambda: lora("qkv", 16, 1024, FP32)
    cases["lora-qkv-r16-fp32-split-k"] = lambda: lora("qkv", 16, 16, FP32, split_k=4)
    cases["lora-qkv-r128"] = lambda: lora("qkv", 128, 1024)
    cases["packed-gemm-tuned"] = lambda: packed_gemm(16, configs=_packed_tuned())  # every tile the tables name
    for bits, group_size in ((4, 128), (4, 32), (8, 32), (8, 128), (4, 4096)):
        for rows in (1, 16):  # the program-a-row kernel, the tiled one; default tiles
            cases[f"packed-gemm-m{rows}-{bits}bit-g{group_size}"] = \
                lambda r=rows, b=bits, g=group_size: packed_gemm(r, b, g)
    for rows in (1, 16):
        cases[f"packed-gemm-m{rows}-fp16"] = lambda r=rows: packed_gemm(r, dtype=torch.float16)
        cases[f"packed-gemm-m{rows}-fp32"] = lambda r=rows: packed_gemm(r, dtype=FP32)
    # the fused kernel's large tiles, for row counts under the dequantize-and-cuBLAS threshold
    cases["packed-gemm-prefill-tiles"] = lambda: packed_gemm(128, configs=[(64, 128, 128, 1, 4, 3),
                                                                          (128, 128, 128, 1, 8, 3)])
    cases["packed-gemm-m64-4bit-g32"] = lambda: packed_gemm(64, 4, 32)  # the most shared memory on the default path
    for rows in (1, 16, 64, 256, 4096):  # the default tiles, and the dequantize kernel for many rows
        for group_size in (128, 32):
            cases[f"packed-gemm-mma-m{rows}-g{group_size}"] = \
                lambda r=rows, g=group_size: packed_gemm_mma(r, g)
    cases["packed-gemm-mma-m16-fp16"] = lambda: packed_gemm_mma(16, dtype=torch.float16)
    cases["packed-gemm-mma-m16-fp32"] = lambda: packed_gemm_mma(16, dtype=FP32)
    cases["packed-gemm-mma-m16-per-channel"] = lambda: packed_gemm_mma(16, group_size=4096)
    # a group size that neither divides a tile nor is a multiple of one: scales gathered a weight each
    for rows in (16, 256):
        cases[f"packed-gemm-mma-m{rows}-g96"] = \
            lambda r=rows: packed_gemm_mma(r, group_size=96, shapes=((4032, 4096),))
    cases["packed-gemm-mma-tiles"] = lambda: packed_gemm_mma(64, configs=[(16, 64, 4, 4, 4, True), (16, 64, 4, 4, 4, False),
                                                                          (64, 128, 1, 8, 3, False), (64, 64, 2, 4, 3, True),
                                                                          (128, 128, 1, 8, 3, False), (32, 64, 2, 4, 3, True)])
    for bits in (4, 8):
        cases[f"packed-dequantize-{bits}bit"] = lambda b=bits: packed_dequantize(b)
    cases["packed-dequantize-fp32"] = lambda: packed_dequantize(4, FP32)
    return cases


CASES = _cases()


def run_case(name: str, compiled: list) -> dict:
    """Compile one case; it fails on a compile error or a kernel that would not launch for want of
    shared memory (the launch checks that, so the compile alone does not)."""
    compiled.clear()
    try:
        CASES[name]()
    except Exception as e:  # reported, and the other cases go on
        return {"case": name, "ok": False, "error": f"{type(e).__name__}: {e}"[-2000:]}
    over = [f"{kernel} needs {shared} bytes of shared memory (sm_90 allows {SHARED_MEMORY_LIMIT})"
            for kernel, shared in compiled if shared > SHARED_MEMORY_LIMIT]
    return {"case": name, "ok": not over, "error": "; ".join(over) or None,
            "shared": [shared for _, shared in compiled]}


def main(names: list[str]) -> None:
    compiled = install_compile_only()
    for name in names or CASES:
        print(json.dumps(run_case(name, compiled)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
