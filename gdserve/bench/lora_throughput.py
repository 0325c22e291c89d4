"""`gdserve bench throughput --lora N`: the engine serving N random adapters, mixed round-robin
over the workload's requests, against the base model on the same workload, in one run."""
import argparse
import sys
import tempfile
from pathlib import Path

from gdserve.bench.offline import timed_run
from gdserve.bench.random_adapters import PROJECTIONS, parse_targets, write_random_adapters
from gdserve.bench.results import print_rate, write_result
from gdserve.config import EngineConfig
from gdserve.lora.request import LoRARequest
from gdserve.models.loader import resolve_model

LORA_WORKLOADS = ("cpu", "random")
DEFAULT_LORA_RANK = 16
DEFAULT_MAX_LORAS, DEFAULT_MAX_LORA_RANK = 1, 16  # the engine flags' defaults: --lora sets both


def check_lora_args(args: argparse.Namespace) -> None:
    """Flags that --lora decides or that only apply with it, refused where they conflict."""
    if args.lora is None:
        stray = [f for f, v in (("--lora-rank", args.lora_rank), ("--lora-targets", args.lora_targets)) if v is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)} need --lora N")
        return
    if args.lora < 1:
        raise ValueError(f"--lora must be >= 1, got {args.lora}")
    if args.workload not in LORA_WORKLOADS:
        raise ValueError(f"--lora runs on --workload {' or '.join(LORA_WORKLOADS)}, not {args.workload}")
    rank = lora_rank(args)
    lora_targets(args)
    if args.max_loras not in (DEFAULT_MAX_LORAS, args.lora):
        raise ValueError(f"--max-loras {args.max_loras} conflicts with --lora {args.lora} (which sets max_loras)")
    if args.max_lora_rank not in (DEFAULT_MAX_LORA_RANK, rank):
        raise ValueError(f"--max-lora-rank {args.max_lora_rank} conflicts with --lora-rank {rank} "
                         "(which sets max_lora_rank)")


def lora_rank(args: argparse.Namespace) -> int:
    rank = DEFAULT_LORA_RANK if args.lora_rank is None else args.lora_rank
    if rank < 1:
        raise ValueError(f"--lora-rank must be >= 1, got {rank}")
    return rank


def lora_targets(args: argparse.Namespace) -> tuple[str, ...]:
    return PROJECTIONS if args.lora_targets is None else parse_targets(args.lora_targets)


def run_lora_vs_base(requests: list[dict], model: str, engine_args: dict, adapter_paths: list[Path],
                     rank: int) -> dict:
    """The base model (LoRA off), then the engine with every adapter in a slot (max_loras = the
    number of adapters, max_lora_rank = rank) on the same requests."""
    lora_requests = [LoRARequest(f"adapter{i}", i + 1, str(p)) for i, p in enumerate(adapter_paths)]
    print(f"base model: {len(requests)} requests ...", file=sys.stderr, flush=True)
    base = timed_run(requests, model, {**engine_args, "enable_lora": False})
    print(f"{len(lora_requests)} adapters of rank {rank}, round-robin ...", file=sys.stderr, flush=True)
    lora_args = {**engine_args, "enable_lora": True, "max_loras": len(lora_requests), "max_lora_rank": rank}
    lora = timed_run(requests, model, lora_args, lora_requests)
    return {"base": base, "lora": lora, "ratio": lora["tokens_per_s"] / base["tokens_per_s"]}


def bench_lora(args: argparse.Namespace, requests: list[dict], engine_args: dict, result: dict) -> None:
    """Write the adapters for the model's shapes into a temporary folder, run both, report."""
    rank = lora_rank(args)
    targets = lora_targets(args)
    dtype = EngineConfig(model=args.model, **engine_args).torch_dtype()
    with tempfile.TemporaryDirectory(prefix="gdserve-lora-") as root:
        paths = write_random_adapters(Path(root), resolve_model(args.model), args.lora, rank, targets, dtype)
        result["adapters"] = {"num_adapters": args.lora, "rank": rank, "targets": list(targets),
                              "dtype": str(dtype)}
        result.update(run_lora_vs_base(requests, args.model, engine_args, paths, rank))
    print_rate("base", result["base"])
    print_rate("lora", result["lora"])
    print(f"ratio lora / base: {result['ratio']:.2f}x")
    write_result(result, args.output)


def add_lora_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("multi-LoRA (--workload cpu or random; replaces the HF run)")
    group.add_argument("--lora", type=int, metavar="N",
                       help="serve N random adapters round-robin over the requests, against the base model")
    group.add_argument("--lora-rank", type=int, help=f"the adapters' rank (default {DEFAULT_LORA_RANK})")
    group.add_argument("--lora-targets", help=f"comma-separated projections (default {','.join(PROJECTIONS)})")
