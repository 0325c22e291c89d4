"""Device diagnostic: what the order of admission is worth on `random_workload()` n=256. Runs the
engine (CUDA graphs, bf16) on the workload as given (FCFS) and sorted longest `max_tokens` first,
at several token budgets. The sorted order is an oracle (a server does not know how long an answer
will be); it bounds what any scheduling policy could gain. Spreading the prefill over the decode
phase (small budgets) keeps the decode steps' GEMMs near the compute ridge instead of re-reading
the weights for a few rows.
Usage: python3 scripts/schedule_order_gpu.py [NUM_LAYERS] [BUDGET,...] (GDSERVE_SHARED and the
tokenizer as for bench_gpu.py; writes schedule_order.json under $OUT)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_gpu  # noqa: E402  (makes gdserve importable and installs the carried wheels)
from sweep_engine_gpu import run_each  # noqa: E402


def main() -> None:
    test_gpu.setup_imports()
    from gdserve.bench.workloads import load_workload_module
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    num_layers = int(args[0]) if args else 32
    budgets = [int(b) for b in args[1].split(",")] if len(args) > 1 else [8192, 768, 1280, 2304]
    fcfs = load_workload_module().random_workload(n=256)
    longest_first = sorted(fcfs, key=lambda r: -r["max_tokens"])
    runs = ([("0:fcfs/8192", fcfs, 8192)]
            + [(f"{i + 1}:longest_first/{b}", longest_first, b) for i, b in enumerate(budgets)]
            + [(f"{len(budgets) + 1}:fcfs/8192", fcfs, 8192)])
    run_each([(label, requests, lambda b=budget: {"max_num_batched_tokens": b}) for label, requests, budget in runs],
             num_layers, {"workload": "random_workload(n=256)"}, "schedule_order.json")


if __name__ == "__main__":
    main()
