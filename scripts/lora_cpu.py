"""Times add_lora's CPU path at SmolLM2-135M's shapes (4 adapters of rank 16 in 4 slots, in
DTYPE=bfloat16 (the engine's default) or float32, the torch threads this machine gives): per layer and token count, microseconds a call of the base
linear, of add_lora for decode-like steps (the adapters interleaved token by token), prefill-like
ones (segments of 256 tokens) and one adapter for every token, of a step with no adapter, and of
add_lora_reference (per-token weight gathers). The last lines sum the four layers, as one decoder
layer sees them. Usage: python scripts/lora_cpu.py [T ...] (default 1 8 64 256 2048)."""
import os
import sys
import time

import torch
import torch.nn.functional as F

from gdserve.kernels.lora import LoRAMapping, add_lora, add_lora_reference

# K, shard sizes of SmolLM2-135M's linear layers (hidden 576, intermediate 1536, q 576, kv 192)
LAYERS = {"qkv": (576, (576, 192, 192)), "o": (576, (576,)), "gate_up": (576, (1536, 1536)), "down": (1536, (576,))}
SLOTS, RANK = 4, 16
DTYPE = getattr(torch, os.environ.get("DTYPE", "bfloat16"))


def best_us(fn, calls: int = 20, rounds: int = 7) -> float:
    """The fastest round's mean: this machine's other load only ever adds time."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times)


def patterns(tokens: int) -> dict[str, list[int]]:
    return {"decode": [t % SLOTS for t in range(tokens)], "prefill": [(t // 256) % SLOTS for t in range(tokens)],
            "one_adapter": [1] * tokens, "no_adapter": [-1] * tokens}


def time_layer(k: int, shard_sizes: tuple[int, ...], tokens: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    n = sum(shard_sizes)
    x, y = torch.randn(tokens, k, generator=g).to(DTYPE), torch.zeros(tokens, n, dtype=DTYPE)
    w = (torch.randn(n, k, generator=g) * 0.02).to(DTYPE)
    lora_a = (torch.randn(SLOTS, len(shard_sizes), RANK, k, generator=g) * 0.02).to(DTYPE)
    lora_b = (torch.randn(SLOTS, n, RANK, generator=g) * 0.02).to(DTYPE)
    calls = max(1, 256 // tokens)
    row = {"linear": best_us(lambda: F.linear(x, w), calls)}
    for name, slots in patterns(tokens).items():
        mapping = LoRAMapping.build(slots, SLOTS, torch.device("cpu"))
        row[name] = best_us(lambda: add_lora(y, x, lora_a, lora_b, shard_sizes, mapping), calls)
    mapping = LoRAMapping.build(patterns(tokens)["decode"], SLOTS, torch.device("cpu"))
    row["reference"] = best_us(lambda: add_lora_reference(y, x, lora_a, lora_b, shard_sizes, mapping),
                                 calls=1 if tokens > 256 else 4, rounds=3)
    return row


def main(token_counts: list[int]) -> None:
    print(f"{DTYPE}, torch threads: {torch.get_num_threads()}; us per call")
    columns = ["linear", "decode", "prefill", "one_adapter", "no_adapter", "reference"]
    print(f"{'layer':8} {'T':>5} " + " ".join(f"{c:>11}" for c in columns))
    for tokens in token_counts:
        total = dict.fromkeys(columns, 0.0)
        for name, (k, shard_sizes) in LAYERS.items():
            row = time_layer(k, shard_sizes, tokens)
            total = {c: total[c] + row[c] for c in columns}
            print(f"{name:8} {tokens:>5} " + " ".join(f"{row[c]:>11.1f}" for c in columns))
        ratios = " ".join(f"{c}/linear {total[c] / total['linear']:.2f}" for c in columns[1:4])
        print(f"{'layer':8} {tokens:>5} " + " ".join(f"{total[c]:>11.1f}" for c in columns) + f"   {ratios}")


if __name__ == "__main__":
    main([int(t) for t in sys.argv[1:]] or [1, 8, 64, 256, 2048])
