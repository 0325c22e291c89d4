"""Tunes and times the W8A8 GEMM on the GPU: Llama-3-8B's linear layers in bf16 (F.linear) against
fp8, per row count M: the whole Fp8Linear (quantize + GEMM), torch._scaled_mm with row-wise scales
(CUTLASS), with per-tensor scales (cuBLASLt; not the same math, for scale), and, up to 256 rows, a
sweep of the Triton kernel's tiles (kernels/triton/fp8_gemm.py), each checked against the
reference. Every figure is 20 calls replayed from a CUDA graph. Prints the best tiles as the
TUNED_SM90 table of kernels/triton/fp8_gemm_configs.py.
Usage: python3 scripts/fp8_gemm_gpu.py (MS=1,64,... picks the Ms; SWEEP=0 skips the Triton sweep;
writes $OUT/fp8_gemm.json)."""
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_common  # noqa: E402  (makes gdserve importable)
from gpu_common import graph_time_us  # noqa: E402

# (in_features, out_features) of Llama-3-8B's linear layers
SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
MS = [int(m) for m in os.environ.get("MS", "1,16,32,64,128,192,256,2048,8192").split(",")]
TUNED_ROWS = (16, 32, 64, 128)  # the row buckets of fp8_gemm_configs.TUNED_SM90 (TRITON_MAX_ROWS)
LAYER = ("qkv", "o", "gate_up", "down")
# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)
CONFIGS = [(bm, bn, bk, sk, 4 if bm * bn <= 64 * 64 else 8, st)
           for bm in (16, 32, 64, 128) for bn in (32, 64, 128) for bk in (128, 256) for sk in (1, 2, 4)
           for st in ((3, 5) if bk == 128 else (3,)) if not (bm == 128 and bk == 256)]


def sweep(a, a_scale, w, w_scale, expected) -> tuple[list, dict]:
    from gdserve.kernels.triton.fp8_gemm import fp8_gemm_triton
    M = a.shape[0]
    timed = {}
    for cfg in CONFIGS:
        if cfg[0] > max(16, M):
            continue
        try:
            err = float((fp8_gemm_triton(a, a_scale, w, w_scale, torch.bfloat16, cfg).float() - expected).abs().max())
            us = graph_time_us(lambda: fp8_gemm_triton(a, a_scale, w, w_scale, torch.bfloat16, cfg))
        except Exception as e:  # a tile that does not compile or fit: say so, go on
            print("config", cfg, "failed:", repr(e)[:200], flush=True)
            continue
        timed[cfg] = (round(us, 1), err)
    best = min(timed, key=lambda c: timed[c][0])
    return list(best), {str(c): t for c, t in timed.items()}


def main() -> None:
    gpu_common.setup_imports()
    from gdserve.kernels.fp8_gemm import fp8_gemm_reference
    from gdserve.kernels.quant import quant_fp8_rowwise
    from gdserve.kernels.triton.fp8_gemm import fp8_gemm_triton
    from gdserve.layers.quantization import Fp8Linear
    torch.manual_seed(0)
    do_sweep = os.environ.get("SWEEP", "1") != "0"
    results, sweeps = {}, {}
    for name in LAYER:
        K, N = SHAPES[name]
        dense = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
        fp8 = Fp8Linear(dense)
        w, w_scale = fp8.weight, fp8.weight_scale
        one = torch.ones((), device="cuda")
        for M in MS:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            q, scale = quant_fp8_rowwise(x)
            row = {
                "bf16": graph_time_us(lambda: F.linear(x, dense.weight)),
                "fp8_layer": graph_time_us(lambda: fp8(x)),
                "quant": graph_time_us(lambda: quant_fp8_rowwise(x)),
                "rowwise_scaled_mm": graph_time_us(lambda: torch._scaled_mm(
                    q, w.t(), scale_a=scale, scale_b=w_scale, out_dtype=torch.bfloat16)),
                "tensorwise_scaled_mm": graph_time_us(lambda: torch._scaled_mm(
                    q, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
            }
            if M <= 256:
                row["triton_default"] = graph_time_us(lambda: fp8_gemm_triton(q, scale, w, w_scale, torch.bfloat16))
                if do_sweep and M in TUNED_ROWS:
                    expected = fp8_gemm_reference(q, scale, w, w_scale, torch.float32)
                    best, timed = sweep(q, scale, w, w_scale, expected)
                    sweeps[f"{name}/{M}"] = timed
                    row["triton_best"], row["triton_best_config"] = timed[str(tuple(best))][0], best
                    row["triton_best_err"] = timed[str(tuple(best))][1]
            row = {k: (round(v, 1) if isinstance(v, float) and not k.endswith("err") else v) for k, v in row.items()}
            results[f"{name}/{M}"] = row
            print(f"{name}/{M}", json.dumps(row), flush=True)
    summary = {}
    for M in MS:
        keys = [k for k in ("bf16", "fp8_layer", "quant", "rowwise_scaled_mm", "tensorwise_scaled_mm",
                            "triton_default", "triton_best") if k in results[f"qkv/{M}"]]
        summary[M] = {k: round(sum(results[f"{n}/{M}"][k] for n in LAYER), 1) for k in keys}
        if do_sweep and M in TUNED_ROWS:  # the one tile best for the whole layer at this M
            common = set.intersection(*(set(sweeps[f"{n}/{M}"]) for n in LAYER))
            total = {c: sum(sweeps[f"{n}/{M}"][c][0] for n in LAYER) for c in common}
            best = min(total, key=total.get)
            summary[M]["triton_one_config"], summary[M]["one_config"] = round(total[best], 1), best
    print("per layer (qkv + o + gate_up + down), us:", json.dumps(summary, indent=1), flush=True)
    if do_sweep:
        table = {SHAPES[n][::-1]: {M: tuple(results[f"{n}/{M}"]["triton_best_config"]) for M in TUNED_ROWS
                                   if f"{n}/{M}" in results} for n in LAYER}
        print("TUNED_SM90 =", "{\n" + "".join(f"    {k}: {v},\n" for k, v in table.items()) + "}", flush=True)
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "fp8_gemm.json").write_text(json.dumps({"shapes": results, "per_layer": summary, "sweeps": sweeps},
                                                  indent=1))


if __name__ == "__main__":
    main()
