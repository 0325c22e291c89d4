"""`gdserve bench latency`: the end-to-end latency of one batch, vLLM's `bench latency`: batch_size
prompts of input_len random token ids generate output_len tokens each (ignore_eos), after warm-up
iterations; the prefix cache is emptied before each iteration so every one prefills in full."""
import argparse
import random
import sys
import time

import numpy as np

from gdserve.bench.results import run_header, write_result
from gdserve.engine_args import add_engine_args, engine_kwargs
from gdserve.models.registry import DEFAULT_MODEL

PERCENTILES = (10, 25, 50, 75, 90, 99)


def check_latency_args(args: argparse.Namespace) -> None:
    for flag in ("input_len", "output_len", "batch_size", "num_iters", "n"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.num_iters_warmup < 0:
        raise ValueError(f"--num-iters-warmup must be >= 0, got {args.num_iters_warmup}")


def random_prompts(batch_size: int, input_len: int, vocab_size: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    low = vocab_size // 10  # clear of the special tokens at the vocabulary's start
    return [{"prompt_token_ids": [rng.randrange(low, vocab_size) for _ in range(input_len)]} for _ in range(batch_size)]


def measure(llm, prompts: list[dict], params, num_iters: int) -> list[float]:
    latencies = []
    for _ in range(num_iters):
        llm.engine.kv_cache.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        latencies.append(time.perf_counter() - start)
    return latencies


def cmd_latency(args: argparse.Namespace) -> None:
    check_latency_args(args)
    from gdserve import LLM, SamplingParams
    from gdserve.config import EngineConfig
    engine_args = engine_kwargs(args)
    if args.tokenizer:
        engine_args["tokenizer"] = args.tokenizer
    result = run_header(args, EngineConfig(model=args.model, **engine_args), args.batch_size)
    llm = LLM(args.model, **engine_args)
    prompts = random_prompts(args.batch_size, args.input_len, llm.engine.model_config.vocab_size, args.seed)
    params = SamplingParams(n=args.n, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=args.output_len,
                            seed=args.seed)
    print(f"warming up: {args.num_iters_warmup} iterations ...", file=sys.stderr, flush=True)
    measure(llm, prompts, params, args.num_iters_warmup)
    print(f"measuring: {args.num_iters} iterations ...", file=sys.stderr, flush=True)
    latencies = measure(llm, prompts, params, args.num_iters)
    llm.engine.close()
    avg = float(np.mean(latencies))
    result.update(input_len=args.input_len, output_len=args.output_len, batch_size=args.batch_size, n=args.n,
                  avg_latency=avg, latencies=latencies,
                  percentiles=dict(zip(map(str, PERCENTILES), map(float, np.percentile(latencies, PERCENTILES)))),
                  output_tokens_per_s=args.batch_size * args.n * args.output_len / avg)
    print(f"Avg latency: {avg:.4f} seconds")
    for q, v in result["percentiles"].items():
        print(f"{q}% percentile latency: {v:.4f} seconds")
    print(f"output tokens/s: {result['output_tokens_per_s']:.1f}")
    write_result(result, args.output_json)


def add_latency_parser(sub) -> None:
    p = sub.add_parser("latency", help="end-to-end latency of one batch (vLLM's bench latency)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--num-iters-warmup", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=30)
    p.add_argument("--seed", type=int, default=0, help="draws the prompts and seeds the sampling")
    p.add_argument("--tokenizer", help="the tokenizer's model or directory (default: the model's own)")
    p.add_argument("--output-json", help="write the figures to this JSON file")
    add_engine_args(p)
    p.set_defaults(func=cmd_latency, workload="latency")
