"""`gdserve serve ...`, `gdserve generate ...` and `gdserve bench ...`."""
import argparse
import sys

from gdserve.config import KV_CACHE_DTYPES
from gdserve.layers.quantization import QUANTIZATIONS
from gdserve.models.registry import DEFAULT_MODEL


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="auto", help="auto | float32 | float16 | bfloat16")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES],
                        help="auto: the model's dtype; fp8 (e4m3) / fp8_e5m2: 8-bit K/V, scale 1.0")
    parser.add_argument("--quantization", "-q", choices=QUANTIZATIONS,
                        help="fp8: linear layers in fp8 e4m3 (a scale per output channel), activations "
                             "quantized per token (W8A8; CUDA compute capability 8.9+, or CPU)")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, help="tokens per step (default: 8192 on CUDA, 2048 on CPU)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-cache-memory", type=int, default=1 << 30, help="KV cache bytes (CPU)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    parser.add_argument("--grammar-compile-timeout-s", type=float, default=10.0)
    parser.add_argument("--grammar-compile-workers", type=int,
                        help="processes compiling constraints, started with the engine (default: the usable "
                             "CPU cores less one, at most 8)")
    parser.add_argument("--grammar-cache-dir", default="auto",
                        help="compiled grammars persist here across restarts (default: $GDSERVE_CACHE/grammars; "
                             "'none' turns it off)")
    parser.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs for decode steps")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                        help="read sampled tokens back during the next step's forward (default: on CUDA)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    return dict(dtype=args.dtype, device=args.device, kv_cache_dtype=args.kv_cache_dtype,
                quantization=args.quantization,
                max_model_len=args.max_model_len,
                max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                block_size=args.block_size, kv_cache_memory=args.kv_cache_memory,
                gpu_memory_utilization=args.gpu_memory_utilization,
                enable_prefix_caching=args.enable_prefix_caching, load_format=args.load_format,
                grammar_compile_timeout_s=args.grammar_compile_timeout_s,
                grammar_compile_workers=args.grammar_compile_workers, enforce_eager=args.enforce_eager,
                grammar_cache_dir=None if args.grammar_cache_dir == "none" else args.grammar_cache_dir,
                async_scheduling=args.async_scheduling)


def cmd_generate(args: argparse.Namespace) -> None:
    from gdserve import LLM, SamplingParams
    print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    llm = LLM(args.model, **engine_kwargs(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    if args.chat:
        outputs = llm.chat([{"role": "user", "content": args.chat}], params)
    else:
        outputs = llm.generate(args.prompt, params)
    for out in outputs:
        print(out.outputs[0].text)


def cmd_serve(args: argparse.Namespace) -> None:
    from gdserve.entrypoints.openai.server import run_server
    run_server(args, engine_kwargs(args))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gdserve")
    sub = parser.add_subparsers(dest="command", required=True)

    from gdserve.entrypoints.openai.server import add_serve_args
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API over HTTP")
    serve.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    add_serve_args(serve)
    add_engine_args(serve)
    serve.set_defaults(func=cmd_serve)

    gen = sub.add_parser("generate", help="generate offline from a prompt or a chat message")
    gen.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    what = gen.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt")
    what.add_argument("--chat", help="one user message, formatted with the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int)
    add_engine_args(gen)
    gen.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    from gdserve.bench.throughput import add_throughput_parser
    add_throughput_parser(bench, add_engine_args)
    from gdserve.bench.maskbench import add_maskbench_parser; add_maskbench_parser(bench)  # noqa: E702
    from gdserve.bench.serve import add_serve_bench_parser; add_serve_bench_parser(bench)  # noqa: E702
    from gdserve.bench.grammar import add_grammar_bench_parser; add_grammar_bench_parser(bench)  # noqa: E702

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except ValueError as e:
        parser.exit(2, f"gdserve: error: {e}\n")


if __name__ == "__main__":
    main()
