"""Times the LoRA kernels on the GPU at Llama-3-8B's shapes, bf16, 4 adapters in 8 slots: per
layer and token count, the base layer (F.linear) against BGMV and SGMV, for decode-like steps (the
adapters interleaved token by token) and prefill-like ones (segments of 512 tokens). Every figure
is replayed from a CUDA graph (fp8_gemm_gpu.graph_time_us).
Usage: python3 scripts/lora_gpu.py (TS=1,64,... picks the token counts; writes $OUT/lora.json)."""
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_gpu  # noqa: E402  (makes gdserve importable)
from fp8_gemm_gpu import graph_time_us  # noqa: E402

# K, shard sizes of Llama-3-8B's linear layers
LAYERS = {"qkv": (4096, (4096, 1024, 1024)), "o": (4096, (4096,)), "gate_up": (4096, (14336, 14336)),
          "down": (14336, (4096,))}
TS = [int(t) for t in os.environ.get("TS", "1,16,64,128,256,512,2048,8192").split(",")]
RANKS = (16, 64)


def token_slots(tokens: int, kind: str) -> list[int]:
    if kind == "decode":
        return [t % 4 for t in range(tokens)]
    return [(t // 512) % 4 for t in range(tokens)]


def time_layer(k: int, shard_sizes: tuple[int, ...], rank: int, tokens: int) -> dict:
    from gdserve.kernels.lora import LoRAMapping
    from gdserve.kernels.triton.lora import add_lora_bgmv, add_lora_sgmv
    n = sum(shard_sizes)
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    y = torch.zeros(tokens, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    lora_a = torch.randn(8, len(shard_sizes), rank, k, device="cuda", dtype=torch.bfloat16) * 0.02
    lora_b = torch.randn(8, n, rank, device="cuda", dtype=torch.bfloat16) * 0.02
    row = {"linear_us": round(graph_time_us(lambda: F.linear(x, w)), 2)}
    for kind in ("decode", "prefill"):
        mapping = LoRAMapping.build(token_slots(tokens, kind), torch.device("cuda"))
        row[f"{kind}_bgmv_us"] = round(graph_time_us(
            lambda: add_lora_bgmv(y, x, lora_a, lora_b, shard_sizes, mapping.token_slots)), 2)
        row[f"{kind}_sgmv_us"] = round(graph_time_us(
            lambda: add_lora_sgmv(y, x, lora_a, lora_b, shard_sizes, mapping.segments, mapping.runs.max_length)), 2)
    return row


def main() -> None:
    test_gpu.setup_imports()
    results = {}
    for rank in RANKS:
        for name, (k, shard_sizes) in LAYERS.items():
            for tokens in TS:
                row = time_layer(k, shard_sizes, rank, tokens)
                results[f"{name}-r{rank}-t{tokens}"] = row
                print(f"{name:8} r{rank:<3} T={tokens:<5}", json.dumps(row), flush=True)
    out = Path(os.environ.get("OUT") or "gpu-results")
    out.mkdir(exist_ok=True)
    (out / "lora.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
