"""`gdserve bench throughput --workload agents`: many agents at once, each with its own JSON Schema
that the engine has never compiled, sent together to a fresh engine with an empty compile cache.

For the same requests it measures cold guided tokens/s (the first run, compiles included), warm
guided tokens/s (the same requests again, every grammar compiled) and unguided tokens/s (the same
prompts, each request's max_tokens set to what its cold guided run produced, ignore_eos: the same
tokens without the masks); each schema's compile latency alone, from a compile service with an
empty cache, submit to first mask; which schemas were refused and why; how many outputs parse and
validate, how many max_tokens cut and of those how many inside a JSON string; and, for each run,
the share of a step's time spent on the host on guided rows (accepting tokens, termination
checks, filling masks), mean and p99 over its steps, so that the next bottleneck shows; and the
forward steps each run took and the share of its output tokens that were forced (taken from the
constraint's forced text without a step each: enable_forced_tokens).

Before the clock the engine runs one unguided request and one `choice` request (none of the
schemas): that starts the compile workers and compiles the mask kernel, one-off costs of a
process, not of a new schema. Each guided request samples with a seed of its own (from --seed),
so that runs of the same code sample alike: on the CPU they give the same outputs; on a GPU bf16
logits depend on the batch's composition (which timing changes), so outputs still drift there.
"""
import argparse
import importlib.metadata
import importlib.util
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gdserve.bench.offline import run_rate, warm_llm
from gdserve.bench.results import percentiles, run_header, write_result
from gdserve.config import EngineConfig
from gdserve.engine.progress import GenerationProgress
from gdserve.grammar import GrammarError, allocate_token_bitmask
from gdserve.grammar.service import CompileService
from gdserve.outputs import CompletionOutput, RequestOutput
from gdserve.sampling_params import StructuredOutputsParams, SamplingParams
from gdserve.schemas import SCHEMA_DIR

TARGETS = {"cold_vs_unguided": 0.9, "warm_vs_unguided": 0.98, "compile_p50_ms": 1.0, "compile_p99_ms": 20.0}
COMPILE_QUANTILES = (50, 90, 99)
DEFAULT_MAX_TOKENS = 384
DEFAULT_TEMPERATURE = 1.0
WARM_UP_CHOICE = ["ok"]
DESCRIPTION_CHARS = 200  # of a schema's description, in its prompt


@dataclass
class AgentSchema:
    name: str        # "<dir>/<file>"
    schema: object


def default_num_requests(config: EngineConfig) -> int:
    """The issue's H200 scale on CUDA; what a 2-core CPU runs in a few minutes elsewhere."""
    return 256 if config.torch_device().type == "cuda" else 64


def default_schema_dirs() -> list[Path]:
    """The repository's schemas/ (installed as gdserve.schemas), its subfolders included."""
    return [SCHEMA_DIR]


def read_schema(path: Path) -> object:
    """A schema file, or a MaskBench file ({description, meta, schema, tests}): its schema."""
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"schema file {path} is not JSON: {e}") from None
    return doc["schema"] if isinstance(doc, dict) and "schema" in doc and "tests" in doc else doc


def read_schema_dir(directory: Path, limit: int | None = None) -> list[AgentSchema]:
    """The schemas of directory's *.json files and its subfolders', sorted by path (the first
    `limit`), each named "<dir>/<file>"."""
    files = sorted(directory.rglob("*.json"))[:limit] if directory.is_dir() else []
    if not files:
        raise ValueError(f"no schemas at {directory} (no *.json files): pass --schema-dir with a folder "
                         "of JSON Schema files")
    return [AgentSchema(f"{directory.name}/{path.relative_to(directory)}", read_schema(path)) for path in files]


def load_schemas(dirs: list[Path], n: int, seed: int) -> list[AgentSchema]:
    """n distinct schemas (by content) drawn at random, seeded, from the *.json files of dirs and
    their subfolders."""
    distinct: dict[str, AgentSchema] = {}
    for directory in dirs:
        for item in read_schema_dir(directory):
            distinct.setdefault(json.dumps(item.schema, sort_keys=True), item)
    if n < 1 or n > len(distinct):
        raise ValueError(f"--num-requests must be between 1 and the {len(distinct)} distinct schemas in "
                         f"{', '.join(map(str, dirs))}; got {n}")
    return random.Random(seed).sample(list(distinct.values()), n)


def prompt_text(item: AgentSchema) -> str:
    schema = item.schema if isinstance(item.schema, dict) else {}
    title = schema.get("title") or Path(item.name).stem
    description = str(schema.get("description", ""))[:DESCRIPTION_CHARS]
    return f'Reply with JSON only: one value that follows the JSON Schema "{title}". {description}'.strip()


def prompt_ids(tokenizer, item: AgentSchema) -> list[int]:
    """The prompt, in the tokenizer's chat template where it has one."""
    text = prompt_text(item)
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(text)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(chat, add_special_tokens=False)


# ---- the engine runs ----------------------------------------------------------------------------

def run_batch(engine, prompts: list[list[int]], params: list[SamplingParams],
              grammars: list | None = None) -> tuple[dict, list[RequestOutput]]:
    """Every request added at once, the engine stepped until all finish. Without `grammars` a
    guided request compiles in the background as the server's would; a refused one finishes
    with its error while the others run."""
    grammars = grammars or [None] * len(prompts)
    engine.kv_cache.reset_prefix_cache()  # each run prefills its prompts
    engine.guided.step_times.clear()
    steps_before = engine.num_forward_steps
    start = time.perf_counter()
    finished: dict[str, RequestOutput] = {}
    ids = [_add_request(engine, p, sp, g, finished) for p, sp, g in zip(prompts, params, grammars)]
    every = max(1, len(ids) // 8)
    progress = GenerationProgress(len(ids))
    while len(finished) < len(ids):
        before = len(finished)
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
                progress.update(out.num_prompt_tokens, out.num_generated_tokens)
        if progress.bar is None and len(finished) // every > before // every:  # for logs of runs of minutes
            print(f"  {len(finished)}/{len(ids)} finished after {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
    progress.close()
    seconds = time.perf_counter() - start
    outputs = [finished[i] for i in ids]
    result = run_rate(engine, outputs, seconds, steps_before)
    return {**result, "mask_share": mask_share(engine.guided.step_times)}, outputs


def mask_share(step_times) -> dict:
    """Of each step with guided rows, the share of its time spent on them on the host (accepting
    tokens, termination checks, filling masks): the mean and the p99 over the run's steps; that
    host time per guided row and step, over the run (row_us); and the share of guided rows parked
    (not ready within the step's allowance: the sequence skipped the step)."""
    steps = [step for step in step_times if step[0] > 0]
    if not steps:
        return {"steps": 0, "mean": None, "p99": None, "row_us": None, "parked": None}
    shares = [mask_s / step_s for step_s, mask_s, _, _ in steps]
    rows = sum(step[2] for step in steps)
    return {"steps": len(shares), "mean": round(float(np.mean(shares)), 4),
            "p99": round(float(np.percentile(shares, 99)), 4),
            "row_us": round(1e6 * sum(step[1] for step in steps) / rows, 1) if rows else None,
            "parked": round(sum(step[3] for step in steps) / rows, 4) if rows else None}


def _add_request(engine, prompt: list[int], params: SamplingParams, grammar,
                 finished: dict[str, RequestOutput]) -> str:
    """The request's id; one the engine refuses up front (a ValueError, GrammarError included)
    is finished at once with its error, as one refused while compiling would be."""
    try:
        return engine.add_request(prompt, params, grammar=grammar)
    except ValueError as e:
        request_id = f"refused-{len(finished)}"
        finished[request_id] = RequestOutput(request_id, None, prompt, [CompletionOutput(0, "", [], "error")],
                                             finished=True, error=str(e))
        return request_id


def _warm_up_guided(llm, prompt: list[int]) -> None:
    """Starts the compile workers and compiles the mask kernel. A compile timeout too short for
    even this constraint fails it; the workers have started all the same, and the schemas'
    refusals are what that run measures."""
    try:
        llm.generate([{"prompt_token_ids": prompt}],
                     SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(choice=WARM_UP_CHOICE)),
                     use_tqdm=False)
    except GrammarError:
        pass


def run_engine_runs(llm, items: list[AgentSchema], prompts: list[list[int]], max_tokens: int,
                    temperature: float, seed: int = 0) -> tuple[dict, list[RequestOutput]]:
    """Cold guided, warm guided and unguided runs of the same requests on a fresh engine; returns
    the three rates, their ratios and the cold run's outputs. Each guided request samples with a
    seed of its own (seed + its index; the warm run's are offset by the number of requests, so it
    samples other outputs than the cold run's)."""
    engine = llm.engine
    _warm_up_guided(llm, prompts[0])

    def guided_params(offset: int) -> list[SamplingParams]:
        return [SamplingParams(max_tokens=max_tokens, temperature=temperature, output_kind="final_only",
                               seed=seed + offset + i,
                               structured_outputs=StructuredOutputsParams(json=item.schema))
                for i, item in enumerate(items)]
    guided = guided_params(0)
    print(f"cold guided: {len(items)} requests, each its own schema ...", file=sys.stderr, flush=True)
    cold, outputs = run_batch(engine, prompts, guided)
    compiling = {i: engine.guided.submit(guided[i].structured_outputs) for i, o in enumerate(outputs) if not _refused(o)}
    compiled = [i for i, future in compiling.items() if future.exception() is None]  # cache hits, but for evictions
    grammars = [compiling[i].result() for i in compiled]
    print(f"warm guided: {len(compiled)} requests ...", file=sys.stderr, flush=True)
    warm_params = guided_params(len(items))
    warm, _ = run_batch(engine, [prompts[i] for i in compiled], [warm_params[i] for i in compiled], grammars)
    produced = [i for i, o in enumerate(outputs) if o.outputs[0].token_ids]
    unguided_params = [SamplingParams(max_tokens=len(outputs[i].outputs[0].token_ids), temperature=temperature,
                                      ignore_eos=True, output_kind="final_only") for i in produced]
    print(f"unguided: {len(produced)} requests, the cold run's lengths ...", file=sys.stderr, flush=True)
    unguided, _ = run_batch(engine, [prompts[i] for i in produced], unguided_params)
    return {"cold": cold, "warm": warm, "unguided": unguided,
            "ratios": {"cold_vs_unguided": _ratio(cold, unguided), "warm_vs_unguided": _ratio(warm, unguided)}}, outputs


def _ratio(a: dict, b: dict) -> float | None:
    return a["tokens_per_s"] / b["tokens_per_s"] if a["output_tokens"] and b["tokens_per_s"] else None


def _refused(out: RequestOutput) -> bool:
    """Failed before its first token: its constraint did not compile (or no matcher was made)."""
    return out.error is not None and not out.outputs[0].token_ids


# ---- compile latency ----------------------------------------------------------------------------

def compile_latencies(items: list[AgentSchema], tokenizer, eos_token_ids: set[int], vocab_size: int,
                      timeout_s: float) -> list[dict]:
    """Each schema alone, on one compile worker whose cache starts empty: ms from submit to the
    first mask filled, or to the refusal (a timeout counts its full time)."""
    bitmask = allocate_token_bitmask(1, vocab_size)
    with CompileService(tokenizer, max_workers=1, timeout_s=timeout_s, eos_token_ids=eos_token_ids,
                        vocab_size=vocab_size, cache_dir=None) as service:
        try:
            service.compile("choice", WARM_UP_CHOICE)  # the worker started and holds the vocabulary
        except GrammarError:  # a timeout too short even for this: each schema then counts a refusal
            pass
        return [_first_mask_ms(service, item, bitmask) for item in items]


def _first_mask_ms(service: CompileService, item: AgentSchema, bitmask) -> dict:
    guided = StructuredOutputsParams(json=item.schema)
    start = time.perf_counter()
    try:
        grammar = service.submit(guided.kind, guided.spec, **guided.compile_options()).result()
        grammar.matcher().fill_next_token_bitmask(bitmask, 0)
        error = None
    except Exception as e:  # noqa: BLE001 (a schema that fails, however, is a refusal to count)
        error = str(e) or type(e).__name__
    return {"schema": item.name, "ms": round((time.perf_counter() - start) * 1e3, 3), "error": error}


def compile_summary(latencies: list[dict]) -> dict:
    times = [r["ms"] for r in latencies]
    return {**percentiles(times, COMPILE_QUANTILES), "max": round(max(times), 3) if times else None,
            "schemas": len(latencies), "refused": sum(r["error"] is not None for r in latencies),
            "per_schema": latencies}


# ---- outputs ------------------------------------------------------------------------------------

def ends_inside_string(text: str) -> bool:
    """Whether JSON text that was cut short ends inside a string (its closing quote never came)."""
    inside = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif inside and ch == "\\":
            escaped = True
        elif ch == '"':
            inside = not inside
    return inside


def _schema_error(schema: object, value: object) -> str | None:
    """jsonschema's best error for value (the schema's own draft, formats checked), else None."""
    import jsonschema
    validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(
        validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER).iter_errors(value))
    return None if error is None else f"{error.message} (at {error.json_path})"


def check_outputs(items: list[AgentSchema], outputs: list[RequestOutput]) -> dict:
    """What the accepted requests produced: finished or cut, parsed, valid against their schema."""
    can_validate = importlib.util.find_spec("jsonschema") is not None
    counts = {"accepted": 0, "failed": 0, "stopped": 0, "cut_by_max_tokens": 0, "cut_inside_string": 0,
              "parsed": 0, "valid": 0 if can_validate else None, "invalid": 0 if can_validate else None,
              "not_validated": 0 if can_validate else None}
    details = {"failed": [], "unparsed": [], "invalid": [], "not_validated": []}
    for item, out in zip(items, outputs):
        if _refused(out):
            continue
        counts["accepted"] += 1
        completion = out.outputs[0]
        if out.error is not None:
            counts["failed"] += 1
            details["failed"].append({"schema": item.name, "error": out.error})
            continue
        if completion.finish_reason == "length":
            counts["cut_by_max_tokens"] += 1
            counts["cut_inside_string"] += ends_inside_string(completion.text)
            continue
        counts["stopped"] += 1
        try:
            value = json.loads(completion.text)
        except ValueError as e:
            details["unparsed"].append({"schema": item.name, "error": str(e), "text": completion.text[-200:]})
            continue
        counts["parsed"] += 1
        if not can_validate:
            continue
        try:
            error = _schema_error(item.schema, value)
        except Exception as e:  # noqa: BLE001 (an unresolvable $ref, a schema jsonschema rejects)
            counts["not_validated"] += 1
            details["not_validated"].append({"schema": item.name, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        counts["valid" if error is None else "invalid"] += 1
        if error is not None:
            details["invalid"].append({"schema": item.name, "error": error[:300]})
    validator = (f"jsonschema {importlib.metadata.version('jsonschema')}" if can_validate else
                 "jsonschema is not installed (pip install jsonschema): outputs parsed, not validated")
    return {**counts, "validator": validator, "details": details}


# ---- the command --------------------------------------------------------------------------------

def cmd_agents(args: argparse.Namespace, engine_args: dict) -> None:
    from gdserve.models.loader import load_tokenizer, resolve_model
    engine_args = {**engine_args, "grammar_cache_dir": None}  # every schema compiles from nothing
    config = EngineConfig(model=args.model, **engine_args)
    n = args.num_requests or default_num_requests(config)
    seed = args.seed if args.seed is not None else 0
    max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS
    temperature = DEFAULT_TEMPERATURE if args.temperature is None else args.temperature
    dirs = [Path(d) for d in args.schema_dir] if args.schema_dir else default_schema_dirs()
    items = load_schemas(dirs, n, seed)
    tokenizer = load_tokenizer(resolve_model(config.tokenizer or args.model))
    prompts = [prompt_ids(tokenizer, item) for item in items]
    result = {**run_header(args, config, n), "schema_dirs": [str(d) for d in dirs], "seed": seed,
              "max_tokens": max_tokens, "temperature": temperature,
              "grammar_compile_timeout_s": config.grammar_compile_timeout_s,
              "grammar_compile_workers": config.grammar_compile_workers,
              "grammar_mask_workers": config.grammar_mask_workers, "targets": TARGETS}
    llm = warm_llm(args.model, engine_args, [{"prompt_token_ids": prompts[0]}])
    engine = llm.engine
    try:
        runs, outputs = run_engine_runs(llm, items, prompts, max_tokens, temperature, seed)
        print(f"compile latency: {n} schemas one at a time ...", file=sys.stderr, flush=True)
        latencies = compile_latencies(items, engine.tokenizer, engine.eos_token_ids,
                                      engine.model_config.vocab_size, config.grammar_compile_timeout_s)
    finally:
        engine.close()
    refusals = [{"schema": item.name, "error": out.error} for item, out in zip(items, outputs) if _refused(out)]
    result.update(runs)
    result["schemas"] = {"requested": n, "accepted": n - len(refusals), "refused": len(refusals),
                         "refusals": refusals}
    result["outputs"] = check_outputs(items, outputs)
    result["compile_ms"] = compile_summary(latencies)
    print(format_table(result))
    write_result(result, args.output)


def format_table(r: dict) -> str:
    s, o, c, ratios = r["schemas"], r["outputs"], r["compile_ms"], r["ratios"]
    lines = [f"agents: {s['requested']} requests, each its own schema: {s['accepted']} accepted, "
             f"{s['refused']} refused; max_tokens {r['max_tokens']}, temperature {r['temperature']}",
             f"{'':>10} {'tokens':>8} {'seconds':>8} {'tokens/s':>9} {'vs unguided':>12} {'target':>8}"
             f" {'on masks, mean / p99 of a step':>31} {'us per row':>10} {'parked':>7} {'steps':>6} {'forced':>7}"]
    for name, ratio, target in (("unguided", None, None), ("cold", ratios["cold_vs_unguided"], "cold_vs_unguided"),
                                ("warm", ratios["warm_vs_unguided"], "warm_vs_unguided")):
        run = r[name]
        share = run.get("mask_share") or {}
        masks = f"{share['mean']:.1%} / {share['p99']:.1%}" if share.get("mean") is not None else "-"
        row_us = f"{share['row_us']:.1f}" if share.get("row_us") is not None else "-"
        parked = f"{share['parked']:.2%}" if share.get("parked") is not None else "-"
        forced = f"{run['forced_share']:.1%}" if run.get("forced_share") is not None else "-"
        lines.append(f"{name:>10} {run['output_tokens']:>8} {run['seconds']:>8.1f} {run['tokens_per_s']:>9.1f} "
                     f"{_x(ratio):>12} {_x(TARGETS[target], '>= ') if target else '':>8} {masks:>31} {row_us:>10}"
                     f" {parked:>7} {run.get('forward_steps', '-'):>6} {forced:>7}")
    lines.append(f"compile, one schema at a time, submit to first mask (ms): p50 {_ms(c['p50'])} "
                 f"(target <= {TARGETS['compile_p50_ms']:g}), p90 {_ms(c['p90'])}, p99 {_ms(c['p99'])} "
                 f"(target <= {TARGETS['compile_p99_ms']:g}), max {_ms(c['max'])}; {c['refused']} refused")
    validity = (f"{o['valid']} valid, {o['invalid']} invalid, {o['not_validated']} not validated"
                if o["valid"] is not None else o["validator"])
    lines.append(f"outputs of the {o['accepted']} accepted: {o['parsed']} parse ({validity}); "
                 f"{o['cut_by_max_tokens']} cut by max_tokens ({o['cut_inside_string']} inside a string); "
                 f"{o['failed']} failed")
    return "\n".join(lines)


def _x(ratio: float | None, prefix: str = "") -> str:
    return "-" if ratio is None else f"{prefix}{ratio:.2f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"

