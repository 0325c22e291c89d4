"""Forced text's gain where requests run one at a time (or a few): the first N schemas of a
folder (sorted), each request alone through the engine (`--concurrency` at once), with forced
text off and on, alternating; tokens/s, forward steps and the share of tokens forced per run.

    python scripts/forced_text_alone.py [--schemas schemas] [--num-schemas 16] [--concurrency 1]
        [--disable-any-whitespace] [--order off,on] [--output FILE]
"""
import argparse
import json
from pathlib import Path

from gdserve.bench.agents import prompt_ids, run_batch
from gdserve.bench.forced_text import load_sorted
from gdserve.bench.offline import warm_llm
from gdserve.models.loader import load_tokenizer, resolve_model
from gdserve.models.registry import DEFAULT_MODEL
from gdserve.sampling_params import SamplingParams, StructuredOutputsParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--schemas", default=str(Path(__file__).resolve().parents[1] / "schemas"))
    p.add_argument("--num-schemas", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--disable-any-whitespace", action="store_true", help="compact JSON")
    p.add_argument("--order", default="off,on", help="the runs, in order")
    p.add_argument("--output")
    args = p.parse_args()
    items = load_sorted([Path(args.schemas)], args.num_schemas)
    prompts = [prompt_ids(load_tokenizer(resolve_model(args.model)), item) for item in items]
    engine = warm_llm(args.model, {}, [{"prompt_token_ids": prompts[0]}]).engine
    guided = [StructuredOutputsParams(json=item.schema, disable_any_whitespace=args.disable_any_whitespace)
              for item in items]
    grammars = [engine.guided.submit(g).result() for g in guided]
    params = [SamplingParams(max_tokens=args.max_tokens, temperature=0.0, output_kind="final_only") for _ in items]
    runs = []
    try:
        for name in args.order.split(","):
            engine.guided.forced_tokens = name == "on"
            tokens = seconds = steps = forced = 0
            for k in range(0, len(items), args.concurrency):
                window = slice(k, k + args.concurrency)
                r, _ = run_batch(engine, prompts[window], params[window], grammars[window])
                tokens, seconds, steps = tokens + r["output_tokens"], seconds + r["seconds"], steps + r["forward_steps"]
                forced += r["forced_share"] * r["output_tokens"]
            runs.append({"forced_text": name, "output_tokens": tokens, "seconds": round(seconds, 2),
                         "tokens_per_s": round(tokens / seconds, 1), "forward_steps": steps,
                         "forced_share": round(forced / tokens, 4)})
            print(json.dumps(runs[-1]), flush=True)
    finally:
        engine.close()
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
