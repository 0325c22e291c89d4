"""Decode attention over an fp8 KV cache at the batch sizes and contexts of TensorRT-LLM's table
(batch 1,024; contexts of ~200 tokens in the 128/128 row, ~1,500 and ~3,000 in the long rows; the
2,048/2,048 row's last wave, batch ~115 at ~4,000, on split-K), as the engine's CUDA graphs call
it (max_len = max_model_len = 8,192) and timed as graph replays: the tiles swept, each with its
bandwidth against the device's measured copy bandwidth.
Usage: python3 scripts/decode_attention_gpu.py (writes decode_attention_gpu.json under $OUT)."""
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_common  # noqa: E402


def graph_ms(fn) -> float:
    return gpu_common.graph_time_us(fn) / 1000


def main() -> None:
    gpu_common.setup_imports()
    import torch
    from gdserve.kernels.paged_attention import decode_attention_reference
    from gdserve.kernels.triton.paged_attention import decode_attention_triton
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    copy_gbs = gpu_common.copy_bandwidth_gbs()
    result = {"copy_bandwidth_gbs": round(copy_gbs, 1), "cases": []}
    scale, max_len = 128 ** -0.5, 8192
    for batch, context in ((1024, 192), (1024, 1536), (512, 3072), (115, 4000)):
        q, k_cache, v_cache, tables, lens, kv_bytes = gpu_common.decode_case(batch, context,
                                                                             kv_dtype=torch.float8_e4m3fn)
        ref = decode_attention_reference(q, k_cache, v_cache, tables, lens, [context] * batch, scale)
        kernel = lambda **tile: decode_attention_triton(q, k_cache, v_cache, tables, lens, max_len, scale, **tile)
        configs = gpu_common.sweep_tiles(kernel, ref, kv_bytes, (16, 32, 64, 128), (1, 2, 4), (1, 2, 3),
                                         timer=graph_ms)
        default_ms = graph_ms(kernel)
        best = min(configs, key=lambda c: c["ms"])
        case = {"batch": batch, "context": context, "kv_bytes": kv_bytes, "default_ms": round(default_ms, 4),
                "default_fraction_of_copy": round(kv_bytes / default_ms / 1e6 / copy_gbs, 3), "best": best,
                "best_fraction_of_copy": round(best["gbs"] / copy_gbs, 3),
                "configs": sorted(configs, key=lambda c: c["ms"])[:8]}
        result["cases"].append(case)
        print(json.dumps({k: v for k, v in case.items() if k != "configs"}), flush=True)
        (out / "decode_attention_gpu.json").write_text(json.dumps(result, indent=1))
        del q, k_cache, v_cache, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
