"""`gdserve bench throughput`: output tokens/s of the engine and of HF transformers `generate`
(static batching) on the same standard workload, in one run, with their ratio."""
import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from gdserve.bench.workloads import load_workload_module
from gdserve.models.registry import DEFAULT_MODEL


def _timed_generate(llm, prompts: list[dict], params: list) -> tuple[dict, list]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"output_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}, outputs


def _warm_llm(model: str, engine_args: dict, prompts: list[dict]):
    """The engine, loaded and run once (its prefix cache then emptied: the first timed run would
    find that prompt cached), with the garbage collector settled as the server settles it once
    its engine has loaded."""
    from gdserve import LLM, SamplingParams
    from gdserve.utils import settle_gc
    llm = LLM(model, **engine_args)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2))
    llm.engine.kv_cache.reset_prefix_cache()
    settle_gc()
    return llm


def run_engine(requests: list[dict], model: str, engine_args: dict) -> dict:
    from gdserve import SamplingParams
    prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in requests]
    llm = _warm_llm(model, engine_args, prompts)
    params = [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, ignore_eos=True) for r in requests]
    return _timed_generate(llm, prompts, params)[0]


def run_guided_vs_unguided(requests: list[dict], model: str, engine_args: dict) -> dict:
    """Every request JSON-schema constrained, then the same batch unguided with each request's
    max_tokens set to what its guided run produced: the same work with and without the masks.
    Grammars are compiled (and cached) and one guided request runs before the clock starts."""
    from gdserve import SamplingParams
    from gdserve.sampling_params import GuidedDecodingParams
    prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in requests]
    llm = _warm_llm(model, engine_args, prompts)
    guided = [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0,
                             guided=GuidedDecodingParams(json=r["json_schema"])) for r in requests]
    for p in guided:
        llm.engine.guided.submit(p.guided).result()
    llm.generate(prompts[:1], guided[:1])  # JIT-compiles the bitmask kernel before the clock
    guided_run, outputs = _timed_generate(llm, prompts, guided)
    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    unguided = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    llm.engine.kv_cache.reset_prefix_cache()  # or the second run would skip its prefill
    unguided_run, _ = _timed_generate(llm, prompts, unguided)
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
    return {"output_tokens": useful, "seconds": seconds, "tokens_per_s": useful / seconds,
            "batch_size": batch_size}


def cmd_throughput(args: argparse.Namespace) -> None:
    from gdserve.config import EngineConfig
    from gdserve.entrypoints.cli import engine_kwargs
    from gdserve.models.loader import resolve_model
    workloads = load_workload_module()
    make = {"cpu": workloads.cpu_workload, "random": workloads.random_workload,
            "guided": workloads.guided_workload,
            # the guided workload at the CPU workload's scale
            "cpu-guided": lambda n=32: workloads.guided_workload(n=n, prompt_len=(32, 256), max_tokens=128)}
    make = make[args.workload]
    requests = make(n=args.num_requests) if args.num_requests else make()
    engine_args = engine_kwargs(args)
    config = EngineConfig(model=args.model, **engine_args)
    result = {"command": " ".join(["gdserve"] + sys.argv[1:]), "workload": args.workload,
              "num_requests": len(requests), "model": args.model, "device": str(config.torch_device()),
              "dtype": str(config.torch_dtype()), "kv_cache_dtype": str(config.torch_kv_cache_dtype()),
              "quantization": config.quantization,
              "torch_threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine()}
    if "guided" in args.workload:
        print(f"engine, guided then unguided: {len(requests)} requests ...", file=sys.stderr, flush=True)
        result.update(run_guided_vs_unguided(requests, args.model, engine_args))
        _print("guided", result["guided"])
        _print("unguided", result["unguided"])
        print(f"ratio guided / unguided: {result['ratio']:.2f}x")
        _write(result, args.output)
        return
    print(f"engine: {len(requests)} requests ...", file=sys.stderr, flush=True)
    result["engine"] = run_engine(requests, args.model, engine_args)
    _print("engine", result["engine"])
    if not args.skip_hf:
        print(f"hf generate: static batches of {args.hf_batch_size} ...", file=sys.stderr, flush=True)
        result["hf"] = run_hf(requests, resolve_model(args.model), config.torch_dtype(),
                              config.torch_device(), args.hf_batch_size, dummy=config.load_format == "dummy")
        _print("hf", result["hf"])
        result["ratio"] = result["engine"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
        print(f"ratio engine / hf: {result['ratio']:.2f}x")
    _write(result, args.output)


def _write(result: dict, output: str | None) -> None:
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {output}", file=sys.stderr)


def _print(name: str, r: dict) -> None:
    print(f"{name:>8}: {r['output_tokens']} output tokens in {r['seconds']:.1f} s = "
          f"{r['tokens_per_s']:.1f} tokens/s")


def add_throughput_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("throughput", help="engine vs HF transformers generate on a standard workload")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--workload", choices=["cpu", "random", "guided", "cpu-guided"], default="cpu",
                   help="guided workloads compare the engine guided vs unguided on the same batch")
    p.add_argument("--num-requests", type=int)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--output", help="write the figures to this JSON file")
    add_engine_args(p)
    p.set_defaults(func=cmd_throughput)
