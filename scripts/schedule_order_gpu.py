"""Device diagnostic: what the order of admission is worth on `random_workload()` n=256. Runs the
engine (CUDA graphs, bf16) on the workload as given (FCFS) and sorted longest `max_tokens` first,
at several token budgets. The sorted order is an oracle (a server does not know how long an answer
will be); it bounds what any scheduling policy could gain. Spreading the prefill over the decode
phase (small budgets) keeps the decode steps' GEMMs near the compute ridge instead of re-reading
the weights for a few rows.
Usage: python3 scripts/schedule_order_gpu.py [NUM_LAYERS] [BUDGET,...] (GDSERVE_SHARED and the
tokenizer as for bench_gpu.py; writes schedule_order.json under $OUT)"""
import gc
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import test_gpu  # noqa: E402  (makes gdserve importable and installs the carried wheels)


def main() -> None:
    test_gpu.setup_imports()
    import torch
    from gdserve.bench.throughput import run_engine
    from gdserve.bench.workloads import load_workload_module
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    num_layers = int(args[0]) if args else 32
    budgets = [int(b) for b in args[1].split(",")] if len(args) > 1 else [8192, 768, 1280, 2304]
    fcfs = load_workload_module().random_workload(n=256)
    longest_first = sorted(fcfs, key=lambda r: -r["max_tokens"])
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    result = {"workload": "random_workload(n=256)", "model": f"Llama-3-8B shape, {num_layers} layers",
              "device": torch.cuda.get_device_name(), "runs": []}
    runs = [("fcfs", 8192)] + [("longest_first", b) for b in budgets] + [("fcfs", 8192)]
    with tempfile.TemporaryDirectory() as tmp:
        test_gpu.save_model_dir(Path(tmp), num_layers, test_gpu.tokenizer_arg(sys.argv[1:]))
        for order, budget in runs:
            requests = fcfs if order == "fcfs" else longest_first
            run = run_engine(requests, tmp, {"load_format": "dummy", "dtype": "bfloat16",
                                             "max_num_batched_tokens": budget})
            result["runs"].append({"order": order, "max_num_batched_tokens": budget, **run})
            print(order, budget, json.dumps(run), flush=True)
            (out / "schedule_order.json").write_text(json.dumps(result, indent=1))
            gc.collect()  # the finished run's engine (its KV cache is most of the device)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
