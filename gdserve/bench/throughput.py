"""`gdserve bench throughput`: output tokens/s of the engine and of HF transformers `generate`
(static batching) on the same standard workload, in one run, with their ratio (with --lora N:
the engine serving N adapters against the base model instead; with --dataset-name, vLLM's
`bench throughput` on the engine alone)."""
import argparse
import sys
import time
from pathlib import Path

import torch

from gdserve.bench.agents import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE, cmd_agents
from gdserve.bench.data_parallel import add_data_parallel_args, bench_data_parallel, check_data_parallel_args
from gdserve.bench.dataset_throughput import bench_dataset
from gdserve.bench.datasets.args import add_dataset_args, dataset_name, dataset_spec
from gdserve.bench.lora_throughput import add_lora_args, bench_lora, check_lora_args
from gdserve.bench.offline import greedy_inputs, timed_generate, warm_llm
from gdserve.bench.preemption import add_preemption_args, bench_preemption, check_preemption_args
from gdserve.bench.results import print_rate, rate, run_header, write_result
from gdserve.bench import workloads
from gdserve.engine_args import add_engine_args, engine_kwargs
from gdserve.models.registry import DEFAULT_MODEL


def run_engine(requests: list[dict], model: str, engine_args: dict) -> dict:
    prompts, params = greedy_inputs(requests)
    llm = warm_llm(model, engine_args, prompts)
    result = timed_generate(llm, prompts, params)[0]
    llm.engine.close()
    return result


def run_guided_vs_unguided(requests: list[dict], model: str, engine_args: dict) -> dict:
    """Every request JSON-schema constrained, then the same batch unguided with each request's
    max_tokens set to what its guided run produced: the same work with and without the masks.
    Grammars are compiled (and cached) and one guided request runs before the clock starts."""
    from gdserve import SamplingParams
    from gdserve.sampling_params import StructuredOutputsParams
    prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in requests]
    llm = warm_llm(model, engine_args, prompts)
    guided = [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0,
                             structured_outputs=StructuredOutputsParams(json=r["json_schema"])) for r in requests]
    for p in guided:
        llm.engine.guided.submit(p.structured_outputs).result()
    llm.generate(prompts[:1], guided[:1], use_tqdm=False)  # JIT-compiles the bitmask kernel before the clock
    guided_run, outputs = timed_generate(llm, prompts, guided)
    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    unguided = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    llm.engine.kv_cache.reset_prefix_cache()  # or the second run would skip its prefill
    unguided_run, _ = timed_generate(llm, prompts, unguided)
    llm.engine.close()
    return {"guided": guided_run, "unguided": unguided_run,
            "ratio": guided_run["tokens_per_s"] / unguided_run["tokens_per_s"]}


def run_hf(requests: list[dict], model_dir: Path, dtype: torch.dtype, device: torch.device,
           batch_size: int, dummy: bool = False) -> dict:
    """Static batching: each batch runs until its longest request is done; a request's useful
    tokens are its own max_tokens. dummy: HF's own random init of the config's shapes."""
    from transformers import AutoConfig, AutoModelForCausalLM
    if dummy:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    pad_id = 0
    useful = 0
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i:i + batch_size]
        width = max(len(r["prompt_ids"]) for r in batch)
        ids = torch.tensor([[pad_id] * (width - len(r["prompt_ids"])) + r["prompt_ids"] for r in batch])
        mask = torch.tensor([[0] * (width - len(r["prompt_ids"])) + [1] * len(r["prompt_ids"]) for r in batch])
        max_new = max(r["max_tokens"] for r in batch)
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                                 max_new_tokens=max_new, eos_token_id=None, pad_token_id=pad_id)
        assert out.shape[1] - width == max_new, "HF stopped early"
        useful += sum(r["max_tokens"] for r in batch)
    seconds = time.perf_counter() - start
    return {**rate(useful, seconds), "batch_size": batch_size}


AGENTS_FLAGS = ("schema_dir", "max_tokens", "temperature")


def check_agents_flags(args: argparse.Namespace, dataset: str | None) -> None:
    """The agents workload's flags elsewhere; --seed also draws a dataset's requests."""
    stray = [f"--{f.replace('_', '-')}" for f in AGENTS_FLAGS if getattr(args, f) is not None]
    if stray and args.workload != "agents":
        raise ValueError(f"{', '.join(stray)} apply to --workload agents only")
    if args.seed is not None and dataset is None and args.workload != "agents":
        raise ValueError("--seed applies to --workload agents and to the datasets (--dataset-name) only")


def cmd_throughput(args: argparse.Namespace) -> None:
    from gdserve.config import EngineConfig
    from gdserve.models.loader import resolve_model
    engine_args = engine_kwargs(args)
    if args.tokenizer:
        engine_args["tokenizer"] = args.tokenizer
    dataset = dataset_name(args)
    check_agents_flags(args, dataset)
    if dataset is not None and args.data_parallel_size != 1:
        raise ValueError("--data-parallel-size runs on --workload cpu or random, not on a dataset")
    if dataset is not None:
        bench_dataset(args, dataset_spec(args, dataset), engine_args)
        return
    args.workload = args.workload or "cpu"
    check_lora_args(args)
    check_preemption_args(args)
    check_data_parallel_args(args)
    if args.workload == "agents":
        cmd_agents(args, engine_args)
        return
    make = {"cpu": workloads.cpu_workload, "random": workloads.random_workload, "guided": workloads.guided_workload,
            # the guided workload at the CPU workload's scale
            "cpu-guided": lambda n=32: workloads.guided_workload(n=n, prompt_len=(32, 256), max_tokens=128)}
    make = make[args.workload]
    requests = make(n=args.num_requests) if args.num_requests else make()
    config = EngineConfig(model=args.model, **engine_args)
    result = run_header(args, config, len(requests))
    if "guided" in args.workload:
        print(f"engine, guided then unguided: {len(requests)} requests ...", file=sys.stderr, flush=True)
        result.update(run_guided_vs_unguided(requests, args.model, engine_args))
        print_rate("guided", result["guided"])
        print_rate("unguided", result["unguided"])
        print(f"ratio guided / unguided: {result['ratio']:.2f}x")
        write_result(result, args.output)
        return
    if args.lora is not None:
        bench_lora(args, requests, engine_args, result)
        return
    if args.compare_preemption:
        bench_preemption(requests, args.model, engine_args, result, args.output)
        return
    if args.data_parallel_size > 1:
        bench_data_parallel(requests, args.model, engine_args, args.data_parallel_size, result, args.output)
        return
    print(f"engine: {len(requests)} requests ...", file=sys.stderr, flush=True)
    result["engine"] = run_engine(requests, args.model, engine_args)
    print_rate("engine", result["engine"])
    if not args.skip_hf:
        print(f"hf generate: static batches of {args.hf_batch_size} ...", file=sys.stderr, flush=True)
        result["hf"] = run_hf(requests, resolve_model(args.model), config.torch_dtype(),
                              config.torch_device(), args.hf_batch_size, dummy=config.load_format == "dummy")
        print_rate("hf", result["hf"])
        result["ratio"] = result["engine"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
        print(f"ratio engine / hf: {result['ratio']:.2f}x")
    write_result(result, args.output)


def add_throughput_parser(sub) -> None:
    p = sub.add_parser("throughput", help="engine vs HF transformers generate on a standard workload, or the "
                                          "engine on a dataset (vLLM's bench throughput)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--workload", choices=["cpu", "random", "guided", "cpu-guided", "agents"],
                   help="default cpu; guided workloads compare the engine guided vs unguided on the same batch; "
                        "agents: each request its own JSON Schema, cold and warm compile cache vs unguided")
    p.add_argument("--num-requests", type=int, help="default: the workload's (agents: 256 on CUDA, 64 elsewhere)")
    p.add_argument("--tokenizer", help="the tokenizer's model or directory (default: the model's own)")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--output", "--output-json", dest="output", help="write the figures to this JSON file")
    p.add_argument("--seed", type=int, help="draws the dataset's requests or the agents' schemas (default 0)")
    add_dataset_args(p)
    add_lora_args(p)
    add_preemption_args(p)
    add_data_parallel_args(p)
    agents = p.add_argument_group("agents workload")
    agents.add_argument("--schema-dir", action="append",
                        help="a folder of JSON Schema files (MaskBench files: their 'schema'), repeatable; "
                             "default: the repository's schemas/")
    agents.add_argument("--max-tokens", type=int, help=f"per request (default {DEFAULT_MAX_TOKENS})")
    agents.add_argument("--temperature", type=float, help=f"default {DEFAULT_TEMPERATURE}")
    add_engine_args(p)
    p.set_defaults(func=cmd_throughput)
