"""`gdserve bench forced-text`: what forced text (enable_forced_tokens) changes in the outputs.

Each schema of the given folders (sorted, at most --max-per-dir of each) is asked for once with
forced text and once without, on one engine, at temperature 0 with each request's grammar
compiled before the clock. The outputs are compared token by token: for each pair that differs,
the first differing token, why (compare), and the text from there. Both runs' outputs are
validated against their schema, and each run's tokens/s and forward steps are reported beside
the share of tokens forced.
"""
import argparse
import sys
from pathlib import Path

from gdserve.bench.agents import (AgentSchema, check_outputs, default_schema_dirs, prompt_ids, read_schema_dir,
                                  run_batch)
from gdserve.bench.offline import warm_llm
from gdserve.bench.results import write_result
from gdserve.engine_args import add_engine_args, engine_kwargs
from gdserve.grammar.vocabulary import token_vocabulary
from gdserve.models.loader import load_tokenizer, resolve_model
from gdserve.models.registry import DEFAULT_MODEL
from gdserve.sampling_params import SamplingParams, StructuredOutputsParams

DEFAULT_MAX_TOKENS = 384
CONTEXT_CHARS = 24  # of text shown on each side of a difference


def load_sorted(dirs: list[Path], max_per_dir: int | None) -> list[AgentSchema]:
    return [item for directory in dirs for item in read_schema_dir(directory, max_per_dir)]


def compare(on, off, token_bytes) -> dict | None:
    """None where both runs produced the same tokens; else what differs and where. At the first
    token that differs: "spelling" where one token's bytes start the other's (the same text
    spelled with other tokens: the forced text's spelling is the tokenizer's, the model had
    picked another; whatever follows comes from a different context), "choice" where they
    differ from their first byte (another batch's numerics tipped a near tie)."""
    a, b = on.outputs[0], off.outputs[0]
    if a.token_ids == b.token_ids:
        return None
    k = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
             min(len(a.token_ids), len(b.token_ids)))
    x = token_bytes[a.token_ids[k]] or b"" if k < len(a.token_ids) else b""
    y = token_bytes[b.token_ids[k]] or b"" if k < len(b.token_ids) else b""
    cause = "spelling" if x.startswith(y) or y.startswith(x) else "choice"
    at = next((i for i, (c, d) in enumerate(zip(a.text, b.text)) if c != d), min(len(a.text), len(b.text)))
    lo = max(0, at - CONTEXT_CHARS)
    return {"cause": cause, "same_text": a.text == b.text, "token": k,
            "tokens_there": [x.decode("utf-8", "replace"), y.decode("utf-8", "replace")],
            "text_at": at, "before": a.text[lo:at], "forced": a.text[at:at + CONTEXT_CHARS],
            "decoded": b.text[at:at + CONTEXT_CHARS], "forced_tokens": a.num_forced_tokens}


def cmd_forced_text(args: argparse.Namespace) -> None:
    engine_args = engine_kwargs(args)
    dirs = [Path(d) for d in args.schema_dir] if args.schema_dir else default_schema_dirs()
    items = load_sorted(dirs, args.max_per_dir)
    tokenizer = load_tokenizer(resolve_model(args.model))
    prompts = [prompt_ids(tokenizer, item) for item in items]
    llm = warm_llm(args.model, {**engine_args, "enable_forced_tokens": True}, [{"prompt_token_ids": prompts[0]}])
    engine = llm.engine
    try:
        futures = [engine.guided.submit(StructuredOutputsParams(json=item.schema)) for item in items]
        compiled = [i for i, f in enumerate(futures) if f.exception() is None]
        print(f"{len(compiled)} of {len(items)} schemas compiled", file=sys.stderr, flush=True)
        grammars = [futures[i].result() for i in compiled]
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=0.0, output_kind="final_only")
                  for _ in compiled]
        runs, outputs = {}, {}
        for name, forced in (("forced", True), ("decoded", False)):
            engine.guided.forced_tokens = forced
            print(f"{name}: {len(compiled)} requests ...", file=sys.stderr, flush=True)
            runs[name], outputs[name] = run_batch(engine, [prompts[i] for i in compiled], params, grammars)
    finally:
        engine.close()
    kept = [items[i] for i in compiled]
    token_bytes = token_vocabulary(tokenizer).token_bytes
    diffs = [dict(schema=item.name, **d) for item, on, off in zip(kept, outputs["forced"], outputs["decoded"])
             if (d := compare(on, off, token_bytes)) is not None]
    result = {"command": " ".join(["gdserve"] + sys.argv[1:]), "model": args.model,
              "schema_dirs": [str(d) for d in dirs], "max_per_dir": args.max_per_dir, "max_tokens": args.max_tokens,
              "schemas": len(items), "compiled": len(compiled), **runs,
              "outputs": {name: check_outputs(kept, outs) for name, outs in outputs.items()},
              "same_tokens": len(kept) - len(diffs), "same_text_other_tokens": sum(d["same_text"] for d in diffs),
              "differ_by_spelling": sum(d["cause"] == "spelling" for d in diffs),
              "differ_by_choice": sum(d["cause"] == "choice" for d in diffs), "differences": diffs}
    print(format_table(result))
    write_result(result, args.output)


def format_table(r: dict) -> str:
    lines = [f"forced text: {r['compiled']} of {r['schemas']} schemas compiled; temperature 0, "
             f"max_tokens {r['max_tokens']}",
             f"{'':>8} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'steps':>6} {'forced':>7} {'valid':>6} "
             f"{'invalid':>8} {'cut':>4}"]
    for name in ("forced", "decoded"):
        run, out = r[name], r["outputs"][name]
        lines.append(f"{name:>8} {run['output_tokens']:>7} {run['seconds']:>8.1f} {run['tokens_per_s']:>9.1f} "
                     f"{run['forward_steps']:>6} {run['forced_share']:>7.1%} {out['valid']!s:>6} "
                     f"{out['invalid']!s:>8} {out['cut_by_max_tokens']:>4}")
    lines.append(f"same tokens {r['same_tokens']}, same text in other tokens {r['same_text_other_tokens']}; "
                 f"first differing token: a spelling of the same bytes {r['differ_by_spelling']}, "
                 f"another choice {r['differ_by_choice']}")
    for d in r["differences"]:
        lines.append(f"  {d['schema']}: {d['cause']} at token {d['token']} {d['tokens_there'][0]!r} / "
                     f"{d['tokens_there'][1]!r}; text from {d['text_at']} after {d['before']!r}: "
                     f"{d['forced']!r} / {d['decoded']!r}")
    return "\n".join(lines)


def add_forced_text_parser(sub) -> None:
    p = sub.add_parser("forced-text", help="guided outputs with and without forced text, compared and validated")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--schema-dir", action="append",
                   help="a folder of JSON Schema (or MaskBench) files; repeat for more (default: schemas/)")
    p.add_argument("--max-per-dir", type=int, help="the first N files (sorted) of each folder")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--output", help="write the results to this JSON file")
    add_engine_args(p)
    p.set_defaults(func=cmd_forced_text)
