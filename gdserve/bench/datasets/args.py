"""The dataset flags of `gdserve bench throughput` (vLLM's `bench throughput` names), their
checks, and the requests they sample."""
import argparse
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
        if getattr(args, dest):
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
    check_random_lengths(args.input_len, random_output_len(args), random_range_ratio(args), args.prefix_len or 0)


def check_file_args(args: argparse.Namespace, name: str) -> None:
    if args.dataset_path is None:
        raise ValueError(f"--dataset-name {name} needs --dataset-path")
    if not Path(args.dataset_path).is_file():
        raise ValueError(f"--dataset-path {args.dataset_path}: no such file")
    stray = given(args, RANDOM_ONLY_FLAGS)
    if stray:
        raise ValueError(f"--dataset-name {name} takes no {', '.join(stray)} (the random dataset's)")


def random_output_len(args: argparse.Namespace) -> int:
    return DEFAULT_RANDOM_OUTPUT_LEN if args.output_len is None else args.output_len


def random_range_ratio(args: argparse.Namespace) -> float:
    return 0.0 if args.range_ratio is None else args.range_ratio


def seed(args: argparse.Namespace) -> int:
    return 0 if args.seed is None else args.seed


def sample_requests(args: argparse.Namespace, name: str, tokenizer) -> list[SampleRequest]:
    """The checked flags' requests, with the tokenizer the engine will use."""
    if name == "random":
        return random_requests(args.num_prompts or DEFAULT_NUM_PROMPTS, args.input_len, random_output_len(args),
                               allowed_token_ids(tokenizer), random_range_ratio(args), args.prefix_len or 0,
                               seed(args))
    if name == "sharegpt":
        return sharegpt_requests(load_sharegpt(args.dataset_path), encoder(tokenizer),
                                 args.num_prompts or DEFAULT_NUM_PROMPTS, args.output_len, seed(args))
    entries = load_prompts(args.dataset_path, need_max_tokens=args.output_len is None)
    return prompt_requests(entries, encoder(tokenizer), args.num_prompts, args.output_len, seed(args))


def dataset_record(args: argparse.Namespace, name: str) -> dict:
    """What the result file records of the dataset (the flags as used, defaults applied)."""
    record = {"dataset_name": name, "dataset_path": args.dataset_path, "num_prompts": args.num_prompts,
              "output_len": args.output_len, "seed": seed(args)}
    if name == "random":
        record.update(num_prompts=args.num_prompts or DEFAULT_NUM_PROMPTS, input_len=args.input_len,
                      output_len=random_output_len(args), range_ratio=random_range_ratio(args),
                      prefix_len=args.prefix_len or 0)
    elif name == "sharegpt":
        record.update(num_prompts=args.num_prompts or DEFAULT_NUM_PROMPTS)
    return record


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
