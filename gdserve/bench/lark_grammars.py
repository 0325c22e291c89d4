"""`gdserve bench grammar`: the Lark (kind "grammar") path on built-in grammars, beside llguidance
and xgrammar on the same grammar text, in one run.

Per grammar: compile time (gdserve: the first compile in this process, which builds lark's own
grammar parser once, then the median of --repeats fresh compiles; a CompileService cache hit);
per-token mask fill over --instances random sentences of the grammar (tokenized canonically; each
backend compiles fresh, so the first sentence pays for cold caches), every token checked against
the mask and accepted, then EOS; and --oracle-steps random steps whose masks are checked on sampled
tokens against the slow oracle (grammar/cfg/oracle.py: lark's interactive parser + `regex`).
"""
import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gdserve.kernels.bitmask import bitmask_width, is_allowed
from gdserve.models.registry import DEFAULT_MODEL

PEERS = ("llguidance", "xgrammar")


def _percentiles(times: list[float]) -> dict:
    a = np.array(times) * 1e6
    return {"n": len(a), "p50_us": round(float(np.percentile(a, 50)), 1),
            "p99_us": round(float(np.percentile(a, 99)), 1), "max_us": round(float(a.max()), 1),
            "mean_us": round(float(a.mean()), 1)}


def run_instances(make_matcher, sequences: list[list[int]], eos: int, width: int) -> dict:
    """Fill + check + accept every token of every sequence, then EOS; fill times and failures."""
    bitmask = torch.zeros(1, width, dtype=torch.int32)
    times, rejected = [], 0
    for seq in sequences:
        fill, accept = make_matcher()
        for token in seq + [eos]:
            start = time.perf_counter()
            fill(bitmask)
            times.append(time.perf_counter() - start)
            if not is_allowed(bitmask[0], token) or not accept(token):
                rejected += 1
                break
    return {"fill": _percentiles(times), "rejected": rejected, "instances": len(sequences)}


def bench_gdserve(text_spec: str, tokenizer, sequences, eos, width, repeats: int) -> dict:
    from gdserve.grammar import compile_grammar
    start = time.perf_counter()
    compile_grammar("grammar", text_spec, tokenizer)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        grammar = compile_grammar("grammar", text_spec, tokenizer)
        times.append(time.perf_counter() - start)

    def make():
        m = grammar.matcher()
        return (lambda bm: m.fill_next_token_bitmask(bm, 0)), m.accept_token
    out = run_instances(make, sequences, eos, width)
    out.update(compile_first_s=round(first, 4), compile_s=round(statistics.median(times), 4))
    return out


def cached_compile_ms(tokenizer, spec: str, timeout_s: float) -> float:
    from gdserve.grammar.service import CompileService
    with CompileService(tokenizer, timeout_s=timeout_s) as service:
        service.compile("grammar", spec)
        start = time.perf_counter()
        service.compile("grammar", spec)
        return (time.perf_counter() - start) * 1e3


def bench_peer(name: str, lark_text: str, tokenizer, vocab_size, sequences, eos, width) -> dict:
    start = time.perf_counter()
    if name == "llguidance":
        import llguidance
        import llguidance.hf
        import llguidance.torch
        ll_tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
        start = time.perf_counter()
        compiled = llguidance.LLMatcher(ll_tok, llguidance.LLMatcher.grammar_from_lark(lark_text),
                                        log_level=0)
        if compiled.is_error():
            return {"error": compiled.get_error()}
        compile_s = time.perf_counter() - start

        def make():
            m = compiled.deep_copy()
            return (lambda bm: llguidance.torch.fill_next_token_bitmask(m, bm, 0)), m.consume_token
    else:
        import xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=[eos])
        compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        start = time.perf_counter()
        try:
            compiled = compiler.compile_grammar(xgrammar.Grammar.from_lark(lark_text))
        except Exception as e:  # noqa: BLE001  (the converter's message)
            return {"error": f"{type(e).__name__}: {e}"[:300]}
        compile_s = time.perf_counter() - start

        def make():
            m = xgrammar.GrammarMatcher(compiled)
            return (lambda bm: m.fill_next_token_bitmask(bm, 0)), m.accept_token
    out = run_instances(make, sequences, eos, width)
    out["compile_s"] = round(compile_s, 4)
    return out


def bench_one(name: str, tokenizer, vocab_size: int, args) -> dict:
    from gdserve.grammar import compile_grammar
    from gdserve.grammar.cfg.oracle import LarkOracle, oracle_walk
    from gdserve.grammar.cfg.sample import SentenceSampler
    from gdserve.grammar.cfg.lark_spec import load_grammar_text
    spec = f"builtin:{name}"
    text = load_grammar_text(spec)
    rng = random.Random(args.seed)
    sampler = SentenceSampler(text)
    sequences = []
    while len(sequences) < args.instances:
        # Stripped: llguidance and xgrammar take no %ignore'd text before the first terminal.
        sentence = sampler.sentence(rng).strip()
        ids = tokenizer.encode(sentence, add_special_tokens=False)
        # Kept if lark still parses it, and it survives tokenizing (some rare characters do not).
        if sampler.parses(sentence) and tokenizer.decode(ids) == sentence:
            sequences.append(ids)
    eos, width = tokenizer.eos_token_id, bitmask_width(vocab_size)
    result = {"grammar": spec, "tokens": sum(map(len, sequences)),
              "gdserve": bench_gdserve(spec, tokenizer, sequences, eos, width, args.repeats)}
    result["gdserve"]["compile_cached_ms"] = round(cached_compile_ms(tokenizer, spec, 30.0), 3)
    if args.oracle_steps:
        start = time.perf_counter()
        grammar = compile_grammar("grammar", spec, tokenizer)
        report = oracle_walk(grammar, LarkOracle(text), sequences, rng, args.oracle_steps)
        result["oracle"] = {"steps": report.steps, "checked": report.checked,
                            "unjudged": report.unjudged, "wrong": len(report.wrong),
                            "examples": [repr(w) for w in report.wrong[:5]],
                            "seconds": round(time.perf_counter() - start, 1)}
    for peer in [p for p in args.peers.split(",") if p]:
        result[peer] = bench_peer(peer, text, tokenizer, vocab_size, sequences, eos, width)
    return result


def _row(name: str, r: dict) -> str:
    if "error" in r:
        return f"  {name:<11} error: {r['error'][:100]}"
    f = r["fill"]
    cached = f"  cached {r['compile_cached_ms']:.3f} ms" if "compile_cached_ms" in r else ""
    first = f" (first {r['compile_first_s'] * 1e3:.0f} ms)" if "compile_first_s" in r else ""
    return (f"  {name:<11} compile {r['compile_s'] * 1e3:8.1f} ms{first}{cached}  fill p50 "
            f"{f['p50_us']:7.1f} us  p99 {f['p99_us']:8.1f} us  max {f['max_us']:8.1f} us  "
            f"rejected {r['rejected']}/{r['instances']}")


def cmd_grammar(args: argparse.Namespace) -> None:
    from gdserve.models import load_tokenizer, resolve_model
    model_dir = resolve_model(args.model)
    tokenizer = load_tokenizer(model_dir)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    vocab_size = max(config.get("vocab_size", 0), len(tokenizer))
    results = []
    for name in args.grammars.split(","):
        r = bench_one(name, tokenizer, vocab_size, args)
        results.append(r)
        print(f"{r['grammar']} ({r['tokens']} tokens in {args.instances} sentences)")
        for backend in ["gdserve", *[p for p in args.peers.split(",") if p]]:
            print(_row(backend, r[backend]))
        if "oracle" in r:
            o = r["oracle"]
            print(f"  oracle: {o['wrong']} wrong masks in {o['steps']} steps "
                  f"({o['checked']} token checks, {o['unjudged']} unjudged, {o['seconds']} s)")
        sys.stdout.flush()
    if args.output:
        Path(args.output).write_text(json.dumps({"command": " ".join(sys.argv), "results": results},
                                                indent=1))


def add_lark_bench_parser(sub) -> None:
    p = sub.add_parser("grammar", help="Lark grammar constraints: compile, mask fill and an exact "
                                       "oracle check, beside llguidance and xgrammar")
    p.add_argument("--model", default=DEFAULT_MODEL, help="whose tokenizer to use")
    p.add_argument("--grammars", default="json,sql_select",
                   help="comma-separated built-in grammars (grammar/cfg/*.lark)")
    p.add_argument("--instances", type=int, default=30, help="random sentences per grammar")
    p.add_argument("--repeats", type=int, default=5, help="fresh compiles timed per grammar")
    p.add_argument("--oracle-steps", type=int, default=1000, help="0 to skip the oracle check")
    p.add_argument("--peers", default=",".join(PEERS), help="comma-separated, of "
                                                            + ", ".join(PEERS) + " (or empty)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", help="write the results to this JSON file")
    p.set_defaults(func=cmd_grammar)
