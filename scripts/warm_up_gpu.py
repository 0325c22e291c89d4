"""Device check of the engine's warm-up (ModelRunner.warm_up): after it, which GEMM sizes still
have a slow first call. cuBLAS loads a kernel on its first launch, and that launch waits for the
device's queue to drain; the warm-up launches the kernels a step can use before serving.
Starts the engine (Llama-3-8B shape, random weights), times a second warm-up, then calls each
distinct linear layer at every row count 1..max_num_batched_tokens after a device sync and lists
the calls slower than 0.5 ms on the host (a kernel load took 2-5 ms before the warm-up).
Usage: python3 scripts/warm_up_gpu.py [NUM_LAYERS]"""
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import test_gpu  # noqa: E402


def main() -> None:
    test_gpu.setup_imports()
    import torch
    from gdserve import LLM
    num_layers = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    with tempfile.TemporaryDirectory() as tmp:
        test_gpu.save_model_dir(Path(tmp), num_layers, None)
        start = time.perf_counter()
        llm = LLM(tmp, load_format="dummy", dtype="bfloat16")
        print(f"engine start {time.perf_counter() - start:.1f} s", flush=True)
    runner, config = llm.engine.runner, llm.engine.config
    start = time.perf_counter()
    runner.warm_up(config.max_num_seqs, config.max_num_batched_tokens, llm.engine.max_model_len)
    torch.cuda.synchronize()
    print(f"a second warm-up {time.perf_counter() - start:.2f} s", flush=True)
    for layer in runner._distinct_linears():
        x = torch.zeros(config.max_num_batched_tokens, layer.in_features, device="cuda", dtype=torch.bfloat16)
        slow = []
        for num_rows in range(1, config.max_num_batched_tokens + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            layer(x[:num_rows])
            seconds = time.perf_counter() - start
            if seconds > 0.5e-3:
                slow.append((num_rows, round(seconds * 1e3, 2)))
        print(f"weight {tuple(layer.weight.shape)}: {len(slow)} calls over 0.5 ms (rows, ms): {slow[:24]}", flush=True)


if __name__ == "__main__":
    main()
