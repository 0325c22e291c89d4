"""Device diagnostic: Llama-3-8B's linear layers in bf16 (F.linear, the engine's default) against
W8A8 fp8 (Fp8Linear: the per-token quantization plus torch._scaled_mm with row-wise scales), the
row-wise GEMM alone, and a per-tensor-scaled GEMM alone, per row count M; each timed as 20 calls
replayed from a CUDA graph (gemm_sweep_gpu.graph_time_us). Usage: python3 scripts/fp8_gemm_gpu.py
(MS=1,64,... picks the Ms; writes $OUT/fp8_gemm.json)."""
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_gpu  # noqa: E402  (makes gdserve importable)
from gemm_sweep_gpu import SHAPES, graph_time_us  # noqa: E402

MS = [int(m) for m in os.environ.get("MS", "1,32,64,128,192,256,512,2048,8192").split(",")]


def main() -> None:
    test_gpu.setup_imports()
    from gdserve.kernels.quant import quant_fp8_rowwise
    from gdserve.layers.quantization import Fp8Linear
    torch.manual_seed(0)
    results = {}
    for name, (K, N) in SHAPES.items():
        if name == "lm_head":
            continue
        dense = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
        fp8 = Fp8Linear(dense)
        one = torch.ones((), device="cuda")
        for M in MS:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            q, scale = quant_fp8_rowwise(x)
            row = {
                "bf16": graph_time_us(lambda: F.linear(x, dense.weight)),
                "fp8_layer": graph_time_us(lambda: fp8(x)),
                "quant": graph_time_us(lambda: quant_fp8_rowwise(x)),
                "fp8_rowwise_gemm": graph_time_us(lambda: torch._scaled_mm(
                    q, fp8.weight.t(), scale_a=scale, scale_b=fp8.weight_scale, out_dtype=torch.bfloat16)),
                "fp8_tensorwise_gemm": graph_time_us(lambda: torch._scaled_mm(
                    q, fp8.weight.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
            }
            row = {k: round(v, 1) for k, v in row.items()}
            row["layer_speedup"] = round(row["bf16"] / row["fp8_layer"], 2)
            results[f"{name}/{M}"] = row
            print(f"{name}/{M}", json.dumps(row), flush=True)
    per_m = {M: {k: round(sum(results[f"{n}/{M}"][k] for n in ("qkv", "o", "gate_up", "down")), 1)
                 for k in ("bf16", "fp8_layer", "quant")} for M in MS}
    print("per layer (qkv + o + gate_up + down), us:", json.dumps(per_m), flush=True)
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "fp8_gemm.json").write_text(json.dumps({"shapes": results, "per_layer": per_m}, indent=1))


if __name__ == "__main__":
    main()
