"""Tunes and times the packed-weight GEMM on the GPU: Llama-3-8B's linear layers with 4-bit weights
in groups of 128 against bf16 (F.linear), per row count M: the public op's default path, cuBLAS on
the weight dequantized each call, and, at the tuned row counts, a sweep of the fused kernels'
tiles (kernels/triton/packed_gemm.py: a program a row at one row, the tiled kernel at 16 and
64), each checked against the reference. Every figure is 20
calls replayed from a CUDA graph; GB/s counts the packed weight's bytes (qweight, scales, biases)
once a call. Prints the best tiles as the TUNED_SM90 table of kernels/triton/packed_gemm_configs.py,
and the default path at other formats (8 bits, groups of 32).
Usage: python3 scripts/packed_gemm_gpu.py (MS=1,16,... picks the Ms; SWEEP=0 skips the sweep,
SWEEP=gemv sweeps only the row-a-program kernel, SWEEP=tiled only the tiled one;
writes $OUT/packed_gemm.json)."""
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_common  # noqa: E402  (makes gdserve importable)
from fp8_gemm_gpu import SHAPES  # noqa: E402
from gpu_common import graph_time_us  # noqa: E402

MS = [int(m) for m in os.environ.get("MS", "1,2,4,16,64,128,256,512,2048,8192").split(",")]
GEMV_ROWS = (1,)  # the rows TUNED_GEMV_SM90 is tuned at
TUNED_ROWS = (16, 64)  # the row buckets of TUNED_SM90
LAYER = ("qkv", "o", "gate_up", "down")
BITS, GROUP_SIZE = 4, 128
# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages), BLOCK_M set per M
TILES = [(bn, bk, sk, w, st) for bn in (64, 128, 256) for bk in (128, 256) for sk in (2, 4, 8, 16)
         for w in ((4, 8) if bn == 256 else (4,)) for st in (3, 4)]
# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps) of the row-a-program kernel
GEMV_TILES = [(bn, bk, sk, w) for bn in (64, 128, 256) for bk in (128, 256) for sk in (1, 2, 4, 8, 16) for w in (4, 8)]


def random_packed(K: int, N: int, bits: int, group_size: int, dtype=torch.bfloat16):
    from gdserve.kernels.packed_gemm import PackedWeight
    words = torch.randint(-2 ** 31, 2 ** 31 - 1, (K * bits // 32, N), dtype=torch.int32, device="cuda")
    scales = (torch.rand(K // group_size, N, device="cuda") * 0.002 + 0.001).to(dtype)
    biases = (-scales.float() * (1 << (bits - 1))).to(dtype)
    return PackedWeight(words, scales, biases, bits, group_size)


def sweep(x, w, expected) -> dict:
    from gdserve.kernels.triton.packed_gemm import packed_gemm_triton
    M = x.shape[0]
    timed = {}
    for cfg in GEMV_TILES if M in GEMV_ROWS else [(max(16, M),) + tile for tile in TILES]:
        run = lambda: packed_gemm_triton(x, w.qweight, w.scales, w.biases, w.bits, w.group_size, cfg)
        try:
            err = float((run().float() - expected).abs().max() / expected.abs().max())
            us = graph_time_us(run)
        except Exception as e:  # a tile that does not compile or fit: say so, go on
            print("config", cfg, "failed:", repr(e)[:200], flush=True)
            continue
        timed[cfg] = (round(us, 1), err)
    return timed


def main() -> None:
    try:
        gpu_common.setup_imports()
    except ImportError as e:  # gdserve.grammar's dependencies: the GEMM needs none of them
        print("without gdserve.grammar:", e, flush=True)
    from gdserve.kernels.packed_gemm import packed_gemm, packed_gemm_reference
    from gdserve.kernels.triton.packed_gemm import dequantize_triton
    torch.manual_seed(0)
    do_sweep = os.environ.get("SWEEP", "1") != "0"
    sweep_rows = {"gemv": GEMV_ROWS, "tiled": TUNED_ROWS}.get(os.environ.get("SWEEP"), GEMV_ROWS + TUNED_ROWS)
    results, sweeps = {}, {}
    for name in LAYER:
        K, N = SHAPES[name]
        w = random_packed(K, N, BITS, GROUP_SIZE)
        dense = w.dequantize().t().contiguous()  # F.linear's [N, K]
        gb = w.num_bytes() / 1e9
        for M in MS:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            row = {"bf16": graph_time_us(lambda: F.linear(x, dense)),
                   "packed": graph_time_us(lambda: packed_gemm(x, w)),
                   "dequant_cublas": graph_time_us(lambda: x @ dequantize_triton(w.qweight, w.scales, w.biases,
                                                                                 BITS, GROUP_SIZE))}
            row["packed_gbs"] = gb / row["packed"] * 1e6
            row["bf16_gbs"] = dense.numel() * 2 / 1e9 / row["bf16"] * 1e6
            if do_sweep and M in sweep_rows:
                expected = packed_gemm_reference(x, w).float()
                timed = sweep(x, w, expected)
                sweeps[f"{name}/{M}"] = {str(c): t for c, t in timed.items()}
                best = min(timed, key=lambda c: timed[c][0])
                row.update(best=timed[best][0], best_config=best, best_err=timed[best][1],
                           best_gbs=gb / timed[best][0] * 1e6)
            row = {k: (round(v, 1) if isinstance(v, float) and not k.endswith("err") else v) for k, v in row.items()}
            results[f"{name}/{M}"] = row
            print(f"{name}/{M}", json.dumps(row), flush=True)
        del dense
    summary = {M: {k: round(sum(results[f"{n}/{M}"][k] for n in LAYER), 1)
                   for k in ("bf16", "packed", "dequant_cublas", "best") if k in results[f"qkv/{M}"]} for M in MS}
    print("per layer (qkv + o + gate_up + down), us:", json.dumps(summary, indent=1), flush=True)
    others = {}
    for bits, group_size in ((4, 32), (8, 32), (8, 128), (4, 4096)):
        K, N = SHAPES["qkv"]
        w = random_packed(K, N, bits, group_size)
        for M in (1, 2, 16):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            us = graph_time_us(lambda: packed_gemm(x, w))
            err = float((packed_gemm(x, w).float() - packed_gemm_reference(x, w).float()).abs().max())
            others[f"qkv/{bits}bit/g{group_size}/{M}"] = {"us": round(us, 1), "gbs": round(w.num_bytes() / us / 1e3, 1),
                                                          "max_abs_err": err}
    print("other formats, default path:", json.dumps(others, indent=1), flush=True)
    if do_sweep:
        table = {SHAPES[n][::-1]: {M: results[f"{n}/{M}"]["best_config"] for M in TUNED_ROWS
                                   if "best_config" in results.get(f"{n}/{M}", {})} for n in LAYER}
        print("TUNED_SM90 =", "{\n" + "".join(f"    {k}: {v},\n" for k, v in table.items()) + "}", flush=True)
        gemv = {SHAPES[n][::-1]: results[f"{n}/{GEMV_ROWS[0]}"].get("best_config") for n in LAYER}
        print("TUNED_GEMV_SM90 =", "{\n" + "".join(f"    {k}: {v},\n" for k, v in gemv.items()) + "}", flush=True)
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "packed_gemm.json").write_text(json.dumps({"shapes": results, "per_layer": summary, "sweeps": sweeps,
                                                      "other_formats": others}, indent=1))


if __name__ == "__main__":
    main()
