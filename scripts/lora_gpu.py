"""Times the LoRA kernels on the GPU at Llama-3-8B's shapes, bf16, 4 adapters in 4 slots: per layer,
rank and token count, the base layer's GEMM (F.linear) against add_lora (shrink + expand), for
decode steps (the adapters interleaved token by token) and prefill steps (runs of 512 tokens per
adapter); then per step, over the model's 32 layers, the LoRA time as a share of the base GEMMs'
with the step's grouping of tokens by slot, made once, eagerly (wall time, launches included).
The layers' figures are replayed from a CUDA graph (gpu_common.graph_time_us), as decode steps
are in the engine.
Usage: python3 scripts/lora_gpu.py (DECODE=1,16,... and PREFILL=2048,... pick the token counts;
RANKS=16,64; writes $OUT/lora.json)."""
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_common  # noqa: E402  (makes gdserve importable)
from gpu_common import graph_time_us  # noqa: E402

# K, shard sizes of Llama-3-8B's linear layers (each once per decoder layer)
LAYERS = {"qkv": (4096, (4096, 1024, 1024)), "o": (4096, (4096,)), "gate_up": (4096, (14336, 14336)),
          "down": (14336, (4096,))}
NUM_LAYERS = 32
NUM_SLOTS = 4


def env_ints(name: str, default: str) -> list[int]:
    return [int(v) for v in os.environ.get(name, default).split(",")]


DECODE = env_ints("DECODE", "1,16,64,128,256")
PREFILL = env_ints("PREFILL", "2048,4096,8192")
RANKS = env_ints("RANKS", "16,64")


def token_slots(tokens: int, kind: str) -> list[int]:
    if kind == "decode":
        return [t % NUM_SLOTS for t in range(tokens)]
    return [(t // 512) % NUM_SLOTS for t in range(tokens)]


def eager_time_us(fn, reps: int = 50) -> float:
    """Wall microseconds per call of fn launched eagerly, back to back."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / reps


def time_layer(k: int, shard_sizes: tuple[int, ...], rank: int, mapping) -> dict:
    from gdserve.kernels.lora import add_lora
    n, tokens = sum(shard_sizes), mapping.num_tokens
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    y = torch.zeros(tokens, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    lora_a = torch.randn(NUM_SLOTS, len(shard_sizes), rank, k, device="cuda", dtype=torch.bfloat16) * 0.02
    lora_b = torch.randn(NUM_SLOTS, n, rank, device="cuda", dtype=torch.bfloat16) * 0.02
    linear_us = graph_time_us(lambda: F.linear(x, w))
    lora_us = graph_time_us(lambda: add_lora(y, x, lora_a, lora_b, shard_sizes, mapping))
    return {"linear_us": round(linear_us, 2), "lora_us": round(lora_us, 2), "lora_share": round(lora_us / linear_us, 3)}


def time_step(kind: str, tokens: int, rank: int, results: dict) -> dict:
    """Each layer's figures into results; returns the step's totals over the model's layers."""
    from gdserve.kernels.lora import LoRAMapping
    from gdserve.kernels.lora_groups import LoRAGroups
    mapping = LoRAMapping.build(token_slots(tokens, kind), NUM_SLOTS, torch.device("cuda"))
    group_us = eager_time_us(lambda: LoRAGroups.of(mapping.token_slots, NUM_SLOTS))
    assert mapping.groups.sorted_indices.numel() == tokens  # grouped now, as a step's first layer does
    linear_us = lora_us = 0.0
    for name, (k, shard_sizes) in LAYERS.items():
        row = time_layer(k, shard_sizes, rank, mapping)
        results[f"{kind}-{name}-r{rank}-t{tokens}"] = row
        print(f"{kind:7} {name:8} r{rank:<3} T={tokens:<5}", json.dumps(row), flush=True)
        linear_us += NUM_LAYERS * row["linear_us"]
        lora_us += NUM_LAYERS * row["lora_us"]
    return {"linear_ms": round(linear_us / 1000, 3), "lora_ms": round((lora_us + group_us) / 1000, 3),
            "group_us": round(group_us, 2), "lora_share": round((lora_us + group_us) / linear_us, 3)}


def main() -> None:
    gpu_common.setup_imports()
    results, steps = {}, {}
    for rank in RANKS:
        for kind, token_counts in (("decode", DECODE), ("prefill", PREFILL)):
            for tokens in token_counts:
                steps[f"{kind}-r{rank}-t{tokens}"] = step = time_step(kind, tokens, rank, results)
                print(f"{kind:7} step     r{rank:<3} T={tokens:<5}", json.dumps(step), flush=True)
    out = Path(os.environ.get("OUT") or "gpu-results")
    out.mkdir(exist_ok=True)
    (out / "lora.json").write_text(json.dumps({"layers": results, "steps": steps}, indent=1))


if __name__ == "__main__":
    main()
