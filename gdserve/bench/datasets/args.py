"""The dataset flags of `gdserve bench throughput` (vLLM's `bench throughput` names), their
checks, and the requests they sample."""
import argparse
from dataclasses import dataclass
from pathlib import Path

from gdserve.bench.datasets.prompt_file import load_prompts, prompt_requests
from gdserve.bench.datasets.random_tokens import allowed_token_ids, check_random_lengths, random_requests
from gdserve.bench.datasets.sample import SampleRequest, encoder
from gdserve.bench.datasets.sharegpt import load_sharegpt, sharegpt_requests

DATASET_NAMES = ("random", "sharegpt", "json")
DEFAULT_NUM_PROMPTS = 1000
DEFAULT_RANDOM_OUTPUT_LEN = 128
# Flags that pick a dataset even without --dataset-name, and those of the random dataset alone.
DATASET_FLAGS = ("dataset_path", "input_len", "output_len", "num_prompts", "range_ratio", "prefix_len")
RANDOM_ONLY_FLAGS = ("input_len", "range_ratio", "prefix_len")


@dataclass(frozen=True)
class DatasetSpec:
    """The dataset flags as a run uses them, defaults applied; None where a flag does not apply."""
    dataset_name: str
    dataset_path: str | None
    num_prompts: int | None  # None: every prompt of a json file, in order
    input_len: int | None
    output_len: int | None  # None: each request's own (sharegpt, json)
    range_ratio: float | None
    prefix_len: int | None
    seed: int


def flag(dest: str) -> str:
    return f"--{dest.replace('_', '-')}"


def given(args: argparse.Namespace, dests: tuple[str, ...]) -> list[str]:
    return [flag(d) for d in dests if getattr(args, d) is not None]


def dataset_name(args: argparse.Namespace) -> str | None:
    """--dataset-name, else what the dataset flags imply as in vLLM (a --dataset-path: ShareGPT,
    or json for a .jsonl file; none: random), else None: a standard --workload."""
    if args.dataset_name is not None:
        return args.dataset_name
    if not given(args, DATASET_FLAGS):
        return None
    if args.dataset_path is None:
        return "random"
    return "json" if args.dataset_path.endswith(".jsonl") else "sharegpt"


def check_dataset_args(args: argparse.Namespace, name: str) -> None:
    """Refuse, in one line each, the flags that conflict with a dataset run or with this dataset."""
    picked = [flag("dataset_name")] if args.dataset_name else given(args, DATASET_FLAGS)
    if args.workload is not None:
        raise ValueError(f"{', '.join(picked)} and --workload {args.workload} both pick the requests (a dataset, "
                         "a standard workload): pass one or the other")
    for dest, why in (("num_requests", "a dataset takes --num-prompts"),
                      ("lora", "it runs on --workload cpu or random"),
                      ("compare_preemption", "it runs on --workload cpu or random")):
        if getattr(args, dest) not in (None, False):
            raise ValueError(f"{flag(dest)} does not apply to a dataset: {why}")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.output_len is not None and args.output_len < 1:
        raise ValueError(f"--output-len must be >= 1, got {args.output_len}")
    if name == "random":
        check_random_args(args)
    else:
        check_file_args(args, name)


def check_random_args(args: argparse.Namespace) -> None:
    if args.dataset_path is not None:
        raise ValueError("--dataset-path does not apply to --dataset-name random")
    if args.input_len is None:
        raise ValueError("--dataset-name random needs --input-len")


def check_file_args(args: argparse.Namespace, name: str) -> None:
    if args.dataset_path is None:
        raise ValueError(f"--dataset-name {name} needs --dataset-path")
    if not Path(args.dataset_path).is_file():
        raise ValueError(f"--dataset-path {args.dataset_path}: no such file")
    stray = given(args, RANDOM_ONLY_FLAGS)
    if stray:
        raise ValueError(f"--dataset-name {name} takes no {', '.join(stray)} (the random dataset's)")


def dataset_spec(args: argparse.Namespace, name: str) -> DatasetSpec:
    """The flags, checked, with vLLM's defaults."""
    check_dataset_args(args, name)
    seed = 0 if args.seed is None else args.seed
    num_prompts = DEFAULT_NUM_PROMPTS if args.num_prompts is None and name != "json" else args.num_prompts
    if name != "random":
        return DatasetSpec(name, args.dataset_path, num_prompts, None, args.output_len, None, None, seed)
    spec = DatasetSpec(name, None, num_prompts, args.input_len,
                       DEFAULT_RANDOM_OUTPUT_LEN if args.output_len is None else args.output_len,
                       args.range_ratio or 0.0, args.prefix_len or 0, seed)
    check_random_lengths(spec.input_len, spec.output_len, spec.range_ratio, spec.prefix_len)
    return spec


def sample_requests(spec: DatasetSpec, tokenizer) -> list[SampleRequest]:
    """The dataset's requests, with the tokenizer the engine will use."""
    if spec.dataset_name == "random":
        return random_requests(spec.num_prompts, spec.input_len, spec.output_len, allowed_token_ids(tokenizer),
                               spec.range_ratio, spec.prefix_len, spec.seed)
    if spec.dataset_name == "sharegpt":
        return sharegpt_requests(load_sharegpt(spec.dataset_path), encoder(tokenizer), spec.num_prompts,
                                 spec.output_len, spec.seed)
    entries = load_prompts(spec.dataset_path, need_max_tokens=spec.output_len is None)
    return prompt_requests(entries, encoder(tokenizer), spec.num_prompts, spec.output_len, spec.seed)


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "datasets (vLLM's bench throughput: the engine alone, sampling at temperature 1.0 to each request's "
        "max_tokens; instead of --workload)")
    group.add_argument("--dataset-name", choices=DATASET_NAMES,
                       help="random: random token ids; sharegpt: a ShareGPT JSON file; json: a JSONL of "
                            '{"prompt": str, "max_tokens": int} (or a JSON list). Default: sharegpt with '
                            "--dataset-path (json for a .jsonl file), random without")
    group.add_argument("--dataset-path", help="the ShareGPT or JSONL file")
    group.add_argument("--input-len", type=int, help="random: prompt tokens (after the --prefix-len prefix)")
    group.add_argument("--output-len", type=int,
                       help=f"output tokens per request (random: default {DEFAULT_RANDOM_OUTPUT_LEN}; "
                            "sharegpt and json: overrides the dataset's)")
    group.add_argument("--num-prompts", type=int,
                       help=f"requests (default {DEFAULT_NUM_PROMPTS}; json: every line of the file, in order)")
    group.add_argument("--range-ratio", "--random-range-ratio", dest="range_ratio", type=float,
                       help="random: lengths uniform in [len * (1 - r), len * (1 + r)], r in [0, 1) (default 0)")
    group.add_argument("--prefix-len", type=int, help="random: random tokens shared by every prompt (default 0)")
