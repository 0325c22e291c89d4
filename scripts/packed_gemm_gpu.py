"""Tunes and times the packed-weight GEMM on the GPU: Llama-3-8B's linear layers with 4-bit weights
in groups of 128 against bf16 (F.linear), per row count M: the public op's default path on the
mma layout (the engine's, kernels/triton/packed_gemm_mma.py) and on the rows layout
(kernels/triton/packed_gemm.py), torch's own int4 GEMM (`_weight_int4pack_mm`, tinygemm, the
kernel gpt-fast uses) on the same weights, and, at the tuned row counts, a sweep of the mma
kernel's tiles, each checked against the reference. Every figure is 20 calls replayed from a
CUDA graph; GB/s counts the packed weight's bytes (qweight, scales, biases) once a call. Prints
the best tiles as the TUNED_MMA_SM90 table of kernels/triton/packed_gemm_configs.py, and the
default path at other formats (groups of 32, per channel, 8 bits).
Usage: python3 scripts/packed_gemm_gpu.py (MS=1,16,... picks the Ms; SWEEP=0 skips the sweep;
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

MS = [int(m) for m in os.environ.get("MS", "1,2,4,16,32,64,128,256,512,2048,8192").split(",")]
TUNED_ROWS = (1, 16, 32, 64, 128, 256)  # the row buckets of TUNED_MMA_SM90
LAYER = ("qkv", "o", "gate_up", "down")
BITS, GROUP_SIZE = 4, 128


def mma_tiles(M: int) -> list[tuple]:
    """MmaConfigs (BLOCK_M, BLOCK_N, SPLIT_K, num_warps, num_stages, factored) to sweep at M rows."""
    block_m = min(max(16, 1 << (M - 1).bit_length()), 128)
    tiles = []
    for block_n, warps in ((64, 4), (128, 8)):
        for stages in (3, 4):
            for split_k in (1, 2, 4, 8) if M <= 64 else (1, 2, 4):
                for factored in (True, False) if M <= 32 else (False,):
                    tiles.append((block_m, block_n, split_k, warps, stages, factored))
    if M > 128:
        tiles += [(256, 128, 1, 8, 3, False), (256, 64, 1, 4, 3, False)]
    return tiles


def random_packed(K: int, N: int, bits: int, group_size: int, dtype=torch.bfloat16):
    """Random codes, AWQ-like scales and integer zero points."""
    from gdserve.kernels.packed_gemm import PackedWeight, pack
    q = torch.randint(0, 1 << bits, (K, N), dtype=torch.int32, device="cuda")
    scales = (torch.rand(K // group_size, N, device="cuda") * 0.002 + 0.001).to(dtype)
    zeros = torch.randint(0, 1 << bits, (K // group_size, N), device="cuda")
    return PackedWeight(pack(q, bits), scales, (-scales.float() * zeros).to(dtype), bits, group_size)


def tinygemm(x, w):
    """torch's int4 GEMM on w's codes (W = (q - 8) * scale + zero), or None where it refuses."""
    q = w.codes().t().contiguous().to(torch.int32)  # [N, K]
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
        scale_zero = torch.stack([w.scales, (w.biases.float() + 8 * w.scales.float()).to(w.scales.dtype)], -1)
        run = lambda: torch.ops.aten._weight_int4pack_mm(x, packed, w.group_size, scale_zero.contiguous())
        run()
        return run
    except RuntimeError as e:
        print("tinygemm refused:", repr(e)[:200], flush=True)
        return None


def rel_err(out, expected) -> float:
    return float((out.float() - expected).abs().max() / expected.abs().max())


def sweep(x, w, expected) -> dict:
    from gdserve.kernels.triton.packed_gemm_mma import packed_gemm_mma_triton
    timed = {}
    for cfg in mma_tiles(x.shape[0]):
        run = lambda: packed_gemm_mma_triton(x, w.qweight, w.scales, w.biases, w.group_size, cfg)
        try:
            err = rel_err(run(), expected)
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
    from gdserve.kernels.packed_gemm import packed_gemm, packed_gemm_reference, to_mma
    torch.manual_seed(0)
    do_sweep = os.environ.get("SWEEP", "1") != "0"
    results, sweeps = {}, {}
    for name in LAYER:
        K, N = SHAPES[name]
        rows = random_packed(K, N, BITS, GROUP_SIZE)
        mma = to_mma(rows)
        dense = rows.dequantize().t().contiguous()  # F.linear's [N, K]
        gb = mma.num_bytes() / 1e9
        for M in MS:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            expected = packed_gemm_reference(x, rows).float()
            row = {"bf16": graph_time_us(lambda: F.linear(x, dense)),
                   "mma": graph_time_us(lambda: packed_gemm(x, mma)), "mma_err": rel_err(packed_gemm(x, mma), expected),
                   "rows": graph_time_us(lambda: packed_gemm(x, rows))}
            run = tinygemm(x, rows)
            if run is not None:
                row.update(tinygemm=graph_time_us(run), tinygemm_err=rel_err(run(), expected))
            row["mma_gbs"] = gb / row["mma"] * 1e6
            if do_sweep and M in TUNED_ROWS:
                timed = sweep(x, mma, expected)
                sweeps[f"{name}/{M}"] = {str(c): t for c, t in timed.items()}
                best = min(timed, key=lambda c: timed[c][0])
                row.update(best=timed[best][0], best_config=best, best_err=timed[best][1])
            row = {k: (round(v, 1) if isinstance(v, float) and not k.endswith("err") else v) for k, v in row.items()}
            results[f"{name}/{M}"] = row
            print(f"{name}/{M}", " ".join(f"{k}={v if not k.endswith('err') else f'{v:.1e}'}"
                                           for k, v in row.items()), flush=True)
        del dense
    keys = ("bf16", "mma", "rows", "tinygemm", "best")
    summary = {M: {k: round(sum(results[f"{n}/{M}"][k] for n in LAYER), 1)
                   for k in keys if all(k in results[f"{n}/{M}"] for n in LAYER)} for M in MS}
    print("per layer (qkv + o + gate_up + down), us:", json.dumps(summary), flush=True)
    others = {}
    for bits, group_size in ((4, 32), (4, 4096), (8, 32), (8, 128)):
        K, N = SHAPES["qkv"]
        w = random_packed(K, N, bits, group_size)
        if bits == 4:
            w = to_mma(w)
        for M in (1, 16, 64):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            us = graph_time_us(lambda: packed_gemm(x, w))
            others[f"qkv/{bits}bit/g{group_size}/{M}"] = {
                "us": round(us, 1), "gbs": round(w.num_bytes() / us / 1e3, 1),
                "err": rel_err(packed_gemm(x, w), packed_gemm_reference(x, w).float())}
    print("other formats, default path:", json.dumps(others), flush=True)
    if do_sweep:
        table = {SHAPES[n][::-1]: {M: results[f"{n}/{M}"]["best_config"] for M in TUNED_ROWS
                                   if "best_config" in results.get(f"{n}/{M}", {})} for n in LAYER}
        print("TUNED_MMA_SM90 =", "{\n" + "".join(f"    {k}: {v},\n" for k, v in table.items()) + "}", flush=True)
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "packed_gemm.json").write_text(json.dumps({"shapes": results, "per_layer": summary, "sweeps": sweeps,
                                                      "other_formats": others}, indent=1))


if __name__ == "__main__":
    main()
