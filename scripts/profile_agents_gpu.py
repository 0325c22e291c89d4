"""Device diagnostic: where the host time of the agents bench's guided runs goes. The requests of
`gdserve bench throughput --workload agents` (each its own schema, drawn from schemas/ and, where
carried, build/conformance/maskbench-dev), run cold and then warm on a fresh engine as the bench
runs them, each run under cProfile (the engine's thread: rows, accepted tokens, closing checks;
the matchers stay on it unless --grammar-mask-workers is given, so that the profile shows their
work; with them, each mask worker runs under cProfile too, scripts/mask_worker_profiled.py, and
the report adds the workers' summed stats after the cold run and after both). Llama-3-8B shape,
bf16, random weights.
Usage: python3 scripts/profile_agents_gpu.py [--num-requests N] [--num-layers L] [--max-tokens T]
[--grammar-mask-workers W] [--tokenizer=DIR|byte-pair] (writes agents_cold.prof, agents_warm.prof and agents_profile.txt, the
top functions of each run by own and by cumulative time, under $OUT)."""
import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_common  # noqa: E402

MASKBENCH = ROOT / "build" / "conformance" / "maskbench-dev"  # carried as docs/benchmarks.md says


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--grammar-mask-workers", type=int, default=0)
    args, rest = parser.parse_known_args()
    gpu_common.setup_imports()
    worker_dir = None
    if args.grammar_mask_workers:
        from gdserve.grammar import matcher_pool
        matcher_pool.MODULE = "mask_worker_profiled"  # on sys.path: scripts/ (passed to the workers)
        worker_dir = os.environ["MASK_WORKER_PROFILE_DIR"] = tempfile.mkdtemp(prefix="mask-workers-")
    from gdserve.bench import agents
    from gdserve.bench.offline import warm_llm
    from gdserve.sampling_params import SamplingParams, StructuredOutputsParams
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    dirs = [ROOT / "schemas"] + ([MASKBENCH] if MASKBENCH.is_dir() else [])
    items = agents.load_schemas(dirs, args.num_requests, 0)
    with tempfile.TemporaryDirectory() as model:
        gpu_common.save_model_dir(Path(model), args.num_layers, gpu_common.tokenizer_arg(rest))
        engine_args = {"load_format": "dummy", "dtype": "bfloat16", "grammar_cache_dir": None,
                       "grammar_mask_workers": args.grammar_mask_workers}
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(model)
        prompts = [agents.prompt_ids(tokenizer, item) for item in items]
        llm = warm_llm(model, engine_args, [{"prompt_token_ids": prompts[0]}])
        engine = llm.engine
        try:
            agents._warm_up_guided(llm, prompts[0])
            guided = [SamplingParams(max_tokens=args.max_tokens, temperature=1.0, output_kind="final_only",
                                     structured_outputs=StructuredOutputsParams(json=item.schema)) for item in items]
            report = io.StringIO()
            cold, outputs = profiled("cold", out, report, lambda: agents.run_batch(engine, prompts, guided))
            worker_stats("mask workers after the cold run", worker_dir, engine, report)
            futures = {i: engine.guided.submit(guided[i].structured_outputs)
                       for i, o in enumerate(outputs) if not agents._refused(o)}
            ready = [i for i, f in futures.items() if f.exception() is None]
            grammars = [futures[i].result() for i in ready]
            profiled("warm", out, report, lambda: agents.run_batch(
                engine, [prompts[i] for i in ready], [guided[i] for i in ready], grammars))
            worker_stats("mask workers after both runs", worker_dir, engine, report)
        finally:
            engine.close()
    (out / "agents_profile.txt").write_text(report.getvalue())
    print(report.getvalue())


def worker_stats(title: str, worker_dir: str | None, engine, report: io.StringIO) -> None:
    """The mask workers' stats, summed, into report: a message to each worker a while after its
    last makes it dump them first."""
    if worker_dir is None:
        return
    import time
    time.sleep(1.5)
    engine.guided.pool.held()
    files = [str(p) for p in Path(worker_dir).glob("*.prof")]
    report.write(f"{title} ({len(files)} workers' stats summed)\n")
    if files:
        stats = pstats.Stats(*files, stream=report)
        for key in ("tottime", "cumulative"):
            stats.sort_stats(key).print_stats(30)


def profiled(name: str, out: Path, report: io.StringIO, run):
    """run() under cProfile; its result line and top functions into report, its stats to a file."""
    profile = cProfile.Profile()
    result = profile.runcall(run)
    profile.dump_stats(out / f"agents_{name}.prof")
    report.write(f"{name}: {result[0]}\n")
    for key in ("tottime", "cumulative"):
        pstats.Stats(profile, stream=report).sort_stats(key).print_stats(30)
    return result


if __name__ == "__main__":
    main()
