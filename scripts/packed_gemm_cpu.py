"""Times the packed-weight GEMM on this CPU at SmolLM2-135M's linear shapes: packed_gemm (the native
kernel up to NATIVE_MAX_ROWS rows, dequantized blocks of K above) against torch matmul of the
already dequantized weight in float32 and bf16. GB/s counts the weight's bytes read once a call
(packed: qweight + scales + biases; dense: K * N * dtype size).
Usage: python scripts/packed_gemm_cpu.py [--bits 4 --group-size 32] (writes JSON lines to stdout)."""
import argparse
import json
import time

import torch

from gdserve.kernels.packed_gemm import PackedWeight, pack, packed_gemm

# (in_features, out_features): q/o, k/v, gate_up, down
SHAPES = [(576, 576), (576, 192), (576, 3072), (1536, 576)]
ROWS = [1, 8, 64, 512]


def time_us(fn, min_seconds: float = 0.2) -> float:
    """Median microseconds a call, over batches of calls each at least min_seconds / 5 long."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start > min_seconds / 5:
            break
        calls *= 2
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(times)[2]


def random_packed(K: int, N: int, bits: int, group_size: int, dtype: torch.dtype) -> PackedWeight:
    q = torch.randint(0, 1 << bits, (K, N), dtype=torch.int32)
    scales = (torch.rand(K // group_size, N) * 0.02 + 0.001).to(dtype)
    biases = (-scales.float() * (1 << (bits - 1))).to(dtype)
    return PackedWeight(pack(q, bits), scales, biases, bits, group_size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for K, N in SHAPES:
            w = random_packed(K, N, args.bits, args.group_size, dtype)
            dense = {d: w.dequantize().to(d) for d in (torch.float32, torch.bfloat16)}
            for M in ROWS:
                x = torch.randn(M, K).to(dtype)
                row = {"dtype": str(dtype).split(".")[1], "K": K, "N": N, "M": M,
                       "packed_us": time_us(lambda: packed_gemm(x, w))}
                for d, weight in dense.items():
                    xd = x.to(d)
                    row[f"dense_{str(d).split('.')[1]}_us"] = time_us(lambda: xd @ weight)
                row["packed_gbs"] = w.num_bytes() / row["packed_us"] / 1e3
                row["dense_float32_gbs"] = K * N * 4 / row["dense_float32_us"] / 1e3
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main()
