"""`gdserve bench throughput --compare-preemption`: the same workload on an engine that preempts
by recompute and on one that swaps, in one run. Size the KV cache so that the workload preempts
(`--gpu-memory-utilization` on CUDA, `--kv-cache-memory` on the CPU); `--swap-space` sizes the
swap run's CPU memory."""
import argparse
import sys

from gdserve.bench.offline import timed_run
from gdserve.bench.results import print_rate, write_result

MODES = ("recompute", "swap")


def check_preemption_args(args: argparse.Namespace) -> None:
    if not args.compare_preemption:
        return
    if "guided" in args.workload or args.workload == "agents":
        raise ValueError(f"--compare-preemption runs on --workload cpu or random, not {args.workload}")
    if args.preemption_mode is not None:
        raise ValueError(f"--preemption-mode {args.preemption_mode} conflicts with --compare-preemption "
                         "(which runs both modes)")
    if args.lora is not None:
        raise ValueError("--compare-preemption and --lora are separate benchmarks: pass one")


def bench_preemption(requests: list[dict], model: str, engine_args: dict, result: dict, output: str | None) -> None:
    for mode in MODES:
        print(f"preemption by {mode}: {len(requests)} requests ...", file=sys.stderr, flush=True)
        result[mode] = timed_run(requests, model, {**engine_args, "preemption_mode": mode})
        print_rate(mode, result[mode])
        print(f"    {result[mode]['num_preemptions']} preemptions, {result[mode]['num_swap_outs']} swapped")
    result["ratio"] = result["swap"]["tokens_per_s"] / result["recompute"]["tokens_per_s"]
    print(f"ratio swap / recompute: {result['ratio']:.2f}x")
    if result["recompute"]["num_preemptions"] == 0:
        print("warning: nothing was preempted; shrink the KV cache (--gpu-memory-utilization, --kv-cache-memory) "
              "or pass --schedule-conservativeness 0",
              file=sys.stderr)
    write_result(result, output)


def add_preemption_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compare-preemption", action="store_true",
                        help="run the workload with --preemption-mode recompute, then swap (replaces the HF run)")
