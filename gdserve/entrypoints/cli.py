"""`gdserve serve ...`, `gdserve generate ...` and `gdserve bench ...`."""
import argparse
import sys

from gdserve.engine_args import add_engine_args, engine_kwargs
from gdserve.entrypoints.ray_serve.flags import check_ray_args
from gdserve.entrypoints.serve_flags import add_serve_command_args
from gdserve.models.registry import DEFAULT_MODEL


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
    check_ray_args(args)
    if args.ray:
        from gdserve.entrypoints.ray_serve.run import run_ray_server
        run_ray_server(args, engine_kwargs(args))
    else:
        from gdserve.entrypoints.openai.server import run_server
        run_server(args, engine_kwargs(args))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gdserve")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API over HTTP")
    add_serve_command_args(serve)
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
    add_throughput_parser(bench)
    from gdserve.bench.maskbench import add_maskbench_parser; add_maskbench_parser(bench)  # noqa: E702
    from gdserve.bench.serve import add_serve_bench_parser; add_serve_bench_parser(bench)  # noqa: E702
    from gdserve.bench.lark_grammars import add_lark_bench_parser; add_lark_bench_parser(bench)  # noqa: E702
    from gdserve.bench.latency import add_latency_parser; add_latency_parser(bench)  # noqa: E702
    from gdserve.bench.forced_text import add_forced_text_parser; add_forced_text_parser(bench)  # noqa: E702

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except ValueError as e:
        parser.exit(2, f"gdserve: error: {e}\n")


if __name__ == "__main__":
    main()
