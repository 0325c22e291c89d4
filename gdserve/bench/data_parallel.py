"""`gdserve bench throughput --data-parallel-size N`: the workload on one engine, then on N
independent replicas, one process each (on cuda:0..N-1, or sharing the CPU's cores), in one run.
The requests are split as the replicas' router sends a burst (prefix affinity, then the least
loaded: gdserve.entrypoints.ray_serve.affinity); every replica is warmed before a barrier, and the
replicas' rate is their output tokens over the span from the first start to the last finish."""
import argparse
import hashlib
import os
import queue
import sys
import time

import numpy as np
import torch

from gdserve.bench.offline import greedy_inputs, timed_run, warm_llm
from gdserve.bench.results import print_rate, rate, write_result
from gdserve.entrypoints.ray_serve.affinity import home, overloaded
from gdserve.entrypoints.ray_serve.flags import DEFAULT_IMBALANCED_THRESHOLD

# Prompt tokens that pick a request's replica (the router takes 256 characters: ~64 tokens).
PREFIX_TOKENS = 64
_POLL_S = 5.0


def check_data_parallel_args(args: argparse.Namespace) -> None:
    size = args.data_parallel_size
    if size == 1:
        return
    if size < 1:
        raise ValueError(f"--data-parallel-size must be >= 1, got {size}")
    if args.workload not in ("cpu", "random"):
        raise ValueError(f"--data-parallel-size runs on --workload cpu or random, not {args.workload}")
    if args.lora is not None or args.compare_preemption:
        raise ValueError("--data-parallel-size, --lora and --compare-preemption are separate benchmarks: pass one")
    if args.tensor_parallel_size != 1:
        raise ValueError("--data-parallel-size with --tensor-parallel-size > 1 is not supported: each replica "
                         "runs on one device")
    if args.device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"--data-parallel-size places replica i on cuda:i (or on the CPU): pass --device auto, "
                         f"cuda or cpu, not {args.device}")
    on_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if on_cuda and torch.cuda.device_count() < size:
        raise ValueError(f"--data-parallel-size {size} needs {size} CUDA devices; "
                         f"{torch.cuda.device_count()} are visible")


def split_requests(requests: list[dict], num_replicas: int,
                   threshold: int = DEFAULT_IMBALANCED_THRESHOLD) -> list[list[int]]:
    """The indices of the requests each replica serves, as the router sends them all at once:
    each to its prompt prefix's home replica, unless that one already holds threshold more than
    the least loaded other, which then takes it."""
    names = [f"replica-{i}" for i in range(num_replicas)]
    shares: list[list[int]] = [[] for _ in names]
    for index, request in enumerate(requests):
        first = home(prefix_key(request["prompt_ids"]), names)
        others = [i for i in range(num_replicas) if i != first]
        loads = [len(shares[i]) for i in others]
        target = others[int(np.argmin(loads))] if overloaded(len(shares[first]), loads, threshold) else first
        shares[target].append(index)
    return shares


def prefix_key(prompt_ids: list[int]) -> int:
    head = np.asarray(prompt_ids[:PREFIX_TOKENS], dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(head, digest_size=8).digest(), "big")


def bench_data_parallel(requests: list[dict], model: str, engine_args: dict, num_replicas: int,
                        result: dict, output: str | None) -> None:
    print(f"one engine: {len(requests)} requests ...", file=sys.stderr, flush=True)
    result["engine"] = timed_run(requests, model, engine_args)
    print_rate("engine", result["engine"])
    print(f"{num_replicas} replicas: {len(requests)} requests ...", file=sys.stderr, flush=True)
    result["data_parallel"] = run_replicas(requests, model, engine_args, num_replicas)
    print_rate(f"{num_replicas} replicas", result["data_parallel"])
    result["ratio"] = result["data_parallel"]["tokens_per_s"] / result["engine"]["tokens_per_s"]
    print(f"ratio replicas / one engine: {result['ratio']:.2f}x")
    write_result(result, output)


def run_replicas(requests: list[dict], model: str, engine_args: dict, num_replicas: int) -> dict:
    """The workload split over num_replicas engine processes, timed together."""
    import multiprocessing
    context = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable
    barrier, results = context.Barrier(num_replicas), context.Queue()
    shares = split_requests(requests, num_replicas)
    processes = [context.Process(target=_replica, daemon=True,
                                 args=(i, num_replicas, [requests[j] for j in shares[i]], model, engine_args,
                                       barrier, results))
                 for i in range(num_replicas)]
    for process in processes:
        process.start()
    try:
        replicas = _collect(results, processes)
    finally:
        for process in processes:
            process.join(timeout=_POLL_S)
            if process.is_alive():
                process.kill()
    errors = [f"replica {r['index']}: {r['error']}" for r in replicas if "error" in r]
    if errors:
        raise RuntimeError("; ".join(errors))
    replicas.sort(key=lambda r: r["index"])
    span = max(r["end"] for r in replicas) - min(r["start"] for r in replicas)
    run = rate(sum(r["output_tokens"] for r in replicas), span)
    run["replicas"] = [{k: r[k] for k in ("index", "device", "num_requests", "output_tokens", "tokens_per_s")}
                       for r in replicas]
    return run


def _collect(results, processes) -> list[dict]:
    """One result from each replica; a replica that dies without one is named."""
    collected: list[dict] = []
    while len(collected) < len(processes):
        try:
            collected.append(results.get(timeout=_POLL_S))
        except queue.Empty:
            reported = {r["index"] for r in collected}
            dead = [i for i, p in enumerate(processes) if i not in reported and p.exitcode is not None]
            if dead:
                raise RuntimeError(f"replica {dead[0]} exited with status {processes[dead[0]].exitcode} "
                                   "before reporting") from None
    return collected


def _replica(index: int, num_replicas: int, requests: list[dict], model: str, engine_args: dict,
             barrier, results) -> None:
    """One replica's process: its engine warmed, then its share of the workload once every
    replica is ready."""
    try:
        engine_args = _replica_device(index, num_replicas, engine_args)
        prompts, params = greedy_inputs(requests)
        llm = warm_llm(model, engine_args, prompts or [{"prompt_token_ids": [1]}])
        barrier.wait()
        start = time.time()
        outputs = llm.generate(prompts, params, use_tqdm=False) if prompts else []
        end = time.time()
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        results.put({"index": index, "device": str(llm.engine.device), "num_requests": len(requests),
                     "output_tokens": tokens, "start": start, "end": end,
                     "tokens_per_s": tokens / (end - start) if end > start else 0.0})
        llm.engine.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which names the replica
        barrier.abort()  # the others stop waiting for this one
        results.put({"index": index, "error": f"{type(e).__name__}: {e}"})


def _replica_device(index: int, num_replicas: int, engine_args: dict) -> dict:
    """Replica i on cuda:i; on the CPU, each replica with its share of the cores."""
    device = engine_args.get("device", "auto")
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return {**engine_args, "device": f"cuda:{index}"}
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // num_replicas))
    return engine_args


def add_data_parallel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                        help="also run the workload on this many independent engine replicas (one process "
                             "each, on cuda:0..N-1 or sharing the CPU's cores), the requests split as the "
                             "replicas' router sends them; replaces the HF run")
