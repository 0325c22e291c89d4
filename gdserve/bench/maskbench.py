"""`gdserve bench maskbench`: score JSON Schema constraint compilers by the MaskBench method
(DESIGN.md, "Scoring a constraint compiler") on the MaskBench dev corpus and the
JSON-Schema-Test-Suite, gdserve and its peers (llguidance, xgrammar, outlines-core) side by side.

Per schema: compile and fill the first mask (TTFM); per test instance, `json.dumps(data)` → token
ids, and per token fill the mask (TBM), check the token's bit, accept it; at the end the EOS bit
must be set. A valid instance must get through, an invalid one must be stopped somewhere.

Each backend runs in a worker process (spawned, one at a time) that compiles and checks; the parent
waits at most --timeout-s for the compile and for each instance, and kills and replaces a worker
that overruns (outcome "timeout") or dies (outcome "crash").
"""
import argparse
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from gdserve.bench.peers import BACKENDS, MODULES, Backend, CompileFailed, make_backend
from gdserve.bench.results import percentiles
from gdserve.bench.workloads import shared_dir
from gdserve.kernels.bitmask import bitmask_width, is_allowed
from gdserve.models.registry import DEFAULT_MODEL
from gdserve.utils import settle_gc

SUITES = ("maskbench", "jsts")
# crash: an exception while checking instances, or the worker died: a bug either way.
OUTCOMES = ("passing", "compile_error", "timeout", "validation_error", "invalidation_error", "crash")
WORKER_START_TIMEOUT_S = 300.0  # spawn + imports + tokenizer + backend init + warm-up
COL = 25  # table column width


def default_dirs() -> dict[str, Path]:
    conformance = shared_dir() / "conformance"
    return {"maskbench": conformance / "maskbench-dev",
            "jsts": conformance / "json-schema-test-suite" / "tests" / "draft2020-12"}


# ---- corpora ------------------------------------------------------------------------------------

@dataclass
class Case:
    """One schema and its test instances [(data, valid)]."""
    name: str
    schema: object
    tests: list[tuple[object, bool]]


def _corpus_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        raise ValueError(f"no corpus at {directory} (no *.json files): pass the corpus folders as "
                         "arguments, or set GDSERVE_SHARED to the folder that holds conformance/")
    return files


def load_maskbench(directory: Path, limit: int | None = None, every: int = 1) -> list[Case]:
    """One Case per file ({description, meta, schema, tests: [{description, valid, data}]}): every
    `every`-th file (sorted by name), at most `limit`."""
    cases = []
    for path in _corpus_files(directory)[::every][:limit]:
        doc = json.loads(path.read_text())
        cases.append(Case(path.name, doc["schema"], [(t["data"], t["valid"]) for t in doc["tests"]]))
    return cases


def load_jsts(directory: Path, limit: int | None = None, every: int = 1) -> list[Case]:
    """One Case per test group of the JSON-Schema-Test-Suite (files sorted; optional/ left out):
    every `every`-th group, at most `limit`."""
    cases = []
    for path in _corpus_files(directory):
        for i, group in enumerate(json.loads(path.read_text())):
            cases.append(Case(f"{path.stem}#{i} {group['description']}", group["schema"],
                              [(t["data"], t["valid"]) for t in group["tests"]]))
    return cases[::every][:limit]


# ---- the worker process -------------------------------------------------------------------------

def check_instance(matcher, tokens: list[int], eos_token_id: int, bitmask: torch.Tensor,
                   prefilled: bool) -> dict:
    """Walk `tokens` then EOS through `matcher`. ok: every token allowed and accepted, EOS allowed
    at the end; else `at` (token position, len(tokens) = EOS) and `why` (mask | accept | eos).
    fill_us: each timed fill (the first is skipped when `prefilled`: it was timed as TTFM).
    disagree: tokens where the mask bit and accept_token disagreed."""
    fill_us, disagree = [], 0
    for pos, token in enumerate([*tokens, eos_token_id]):
        if not prefilled:
            bitmask.zero_()
            start = time.perf_counter()
            matcher.fill(bitmask)
            fill_us.append((time.perf_counter() - start) * 1e6)
        prefilled = False
        allowed = is_allowed(bitmask[0], token)
        if pos == len(tokens):
            return {"ok": allowed, "at": None if allowed else pos, "why": None if allowed else "eos",
                    "fill_us": fill_us, "disagree": disagree}
        accepted = matcher.accept(token)
        disagree += allowed != accepted
        if not (allowed and accepted):
            return {"ok": False, "at": pos, "why": "accept" if allowed else "mask",
                    "fill_us": fill_us, "disagree": disagree}


def check_case(backend: Backend, schema: object, instances: list[list[int]], eos_token_id: int,
               bitmask: torch.Tensor, send: Callable[[tuple], None]) -> None:
    """Sends ("compiled", (ttfm_s, report counts or None)) or ("compile_error", message), then one
    ("instance", result) per instance, or ("instance_error", message) for an exception while
    checking (then stops). Report counts: keywords exact / approximated / ignored, for a backend
    whose compiled constraint carries an enforcement report (gdserve's)."""
    start = time.perf_counter()
    try:
        compiled = backend.compile(schema)
        matcher = backend.matcher(compiled)
        bitmask.zero_()
        matcher.fill(bitmask)
    except CompileFailed as e:
        return send(("compile_error", str(e)))
    except Exception as e:  # not the backend's "unsupported": a bug, named as such
        return send(("compile_error", f"internal error {type(e).__name__}: {e}"))
    ttfm_s = time.perf_counter() - start
    report = getattr(compiled, "report", None)
    send(("compiled", (ttfm_s, {k: len(v) for k, v in report.items()} if report else None)))
    for i, tokens in enumerate(instances):
        try:
            if i:
                matcher = backend.matcher(compiled)
            result = check_instance(matcher, tokens, eos_token_id, bitmask, prefilled=i == 0)
        except Exception as e:
            return send(("instance_error", f"instance {i}: {type(e).__name__}: {e}"))
        send(("instance", result))


def _worker_main(conn, factory: Callable[..., Backend], kwargs: dict, log_path: str | None) -> None:
    if log_path:  # the libraries' own warnings (xgrammar writes many) go to the log, not the terminal
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    torch.set_num_threads(1)
    try:
        backend = factory(**kwargs)
    except BaseException as e:
        conn.send(("init_error", f"{type(e).__name__}: {e}"))
        return
    settle_gc()  # as the server's compile workers do, for every backend alike
    conn.send(("ready", backend.settings))
    bitmask = torch.zeros(1, bitmask_width(kwargs["vocab_size"]), dtype=torch.int32)
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the bench is gone
            return
        if msg is None:
            return
        schema, instances = msg
        check_case(backend, schema, instances, kwargs["eos_token_id"], bitmask, conn.send)


class BackendUnavailable(Exception):
    pass


class Worker:
    """One spawned worker process holding one backend."""

    def __init__(self, factory: Callable[..., Backend], kwargs: dict, log_path: str | None = None):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, factory, kwargs, log_path),
                                   daemon=True)
        self.process.start()
        child.close()
        try:
            kind, payload = self.recv(WORKER_START_TIMEOUT_S)
        except (TimeoutError, EOFError) as e:
            self.kill()
            raise BackendUnavailable(f"worker did not start: {type(e).__name__}") from None
        if kind == "init_error":
            self.kill()
            raise BackendUnavailable(payload)
        self.settings = payload

    def send(self, msg) -> None:
        self.conn.send(msg)

    def recv(self, timeout_s: float):
        if not self.conn.poll(timeout_s):
            raise TimeoutError
        return self.conn.recv()  # EOFError when the worker died

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(5)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


# ---- the harness (parent side) ------------------------------------------------------------------

@dataclass
class BackendSpec:
    """A backend to score: `factory(vocab_size=, eos_token_id=, **kwargs)` runs in the worker."""
    name: str
    factory: Callable[..., Backend]
    kwargs: dict = field(default_factory=dict)


@dataclass
class BackendRun:
    name: str
    settings: dict
    per_schema: dict[str, dict] = field(default_factory=dict)
    ttfm_ms: list[float] = field(default_factory=list)
    tbm_us: list[float] = field(default_factory=list)
    disagreements: int = 0
    wall_s: float = 0.0

    def summary(self) -> dict:
        counts = {o: 0 for o in OUTCOMES}
        for r in self.per_schema.values():
            counts[r["outcome"]] += 1
        n = max(len(self.per_schema), 1)
        return {"settings": self.settings, "schemas": len(self.per_schema), "counts": counts,
                "percent": {o: round(100 * c / n, 2) for o, c in counts.items()},
                "ttfm_ms": percentiles(self.ttfm_ms, (50, 90, 99)),
                "tbm_us": {**percentiles(self.tbm_us, (50, 99)),
                           "max": round(max(self.tbm_us), 1) if self.tbm_us else None,
                           "mean": round(float(np.mean(self.tbm_us)), 1) if self.tbm_us else None,
                           "fills": len(self.tbm_us)},
                "mask_accept_disagreements": self.disagreements, "wall_s": round(self.wall_s, 1),
                **self._report_tally(),
                "per_schema": self.per_schema}


    def _report_tally(self) -> dict:
        """Over the compiled schemas with an enforcement report: keywords by how they are
        enforced, and how many schemas have any approximated or ignored."""
        reports = [r["report"] for r in self.per_schema.values() if "report" in r]
        if not reports:
            return {}
        return {"enforcement": {
            "schemas": len(reports),
            "keywords": {k: sum(r.get(k, 0) for r in reports) for k in ("exact", "approximated", "ignored")},
            "schemas_with_approximated": sum(1 for r in reports if r.get("approximated")),
            "schemas_with_ignored": sum(1 for r in reports if r.get("ignored"))}}


def classify(cases_tests: list[tuple[object, bool]], results: list[dict]) -> tuple[str, str | None]:
    """(outcome, detail) of a compiled schema from its instances' results."""
    wrong_invalid = [i for i, ((_, valid), r) in enumerate(zip(cases_tests, results))
                     if not valid and r["ok"]]
    if wrong_invalid:
        return "invalidation_error", f"invalid instance(s) {wrong_invalid} accepted"
    for i, ((_, valid), r) in enumerate(zip(cases_tests, results)):
        if valid and not r["ok"]:
            return "validation_error", f"valid instance {i} rejected at token {r['at']} ({r['why']})"
    return "passing", None


def run_backend(spec: BackendSpec, cases: list[Case], tokens: list[list[list[int]]], *,
                vocab_size: int, eos_token_id: int, timeout_s: float, label: str = "",
                log_path: str | None = None) -> BackendRun:
    """Score one backend on `cases` (tokens[i][j]: the ids of case i's instance j); the worker's
    stdout and stderr go to log_path when given."""
    kwargs = {**spec.kwargs, "vocab_size": vocab_size, "eos_token_id": eos_token_id}
    start = time.perf_counter()
    worker = Worker(spec.factory, kwargs, log_path)
    run = BackendRun(spec.name, worker.settings)
    try:
        for k, (case, case_tokens) in enumerate(zip(cases, tokens)):
            if worker is None:
                worker = Worker(spec.factory, kwargs, log_path)
            run.per_schema[case.name], alive = _run_case(worker, run, case, case_tokens, timeout_s)
            if not alive:
                worker.kill()
                worker = None
            if (k + 1) % 100 == 0:
                print(f"  {spec.name} {label} {k + 1}/{len(cases)} "
                      f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    finally:
        if worker is not None:
            worker.close()
    run.wall_s = time.perf_counter() - start
    return run


def _run_case(worker: Worker, run: BackendRun, case: Case, case_tokens: list[list[int]],
              timeout_s: float) -> tuple[dict, bool]:
    """(per-schema record, whether the worker is still usable)."""
    worker.send((case.schema, case_tokens))
    stage = "compile"
    try:
        kind, payload = worker.recv(timeout_s)
        if kind == "compile_error":
            return {"outcome": "compile_error", "detail": payload[:500]}, True
        ttfm_ms, report = payload[0] * 1e3, payload[1]
        run.ttfm_ms.append(ttfm_ms)
        results = []
        for i in range(len(case_tokens)):
            stage = f"instance {i}"
            kind, payload = worker.recv(timeout_s)
            if kind == "instance_error":
                return {"outcome": "crash", "ttfm_ms": round(ttfm_ms, 3), "detail": payload[:500]}, True
            results.append(payload)
    except TimeoutError:
        return {"outcome": "timeout", "detail": f"{stage} took over {timeout_s:g} s"}, False
    except (EOFError, OSError):
        return {"outcome": "crash", "detail": f"worker died during {stage} "
                f"(exit code {worker.process.exitcode})"}, False
    fills = [us for r in results for us in r["fill_us"]]
    run.tbm_us.extend(fills)
    outcome, detail = classify(case.tests, results)
    record = {"outcome": outcome, "ttfm_ms": round(ttfm_ms, 3),
              "tbm_max_us": round(max(fills), 1) if fills else None}
    if detail:
        record["detail"] = detail
    if report is not None:
        record["report"] = report
    if disagree := sum(r["disagree"] for r in results):
        run.disagreements += disagree
        record["mask_accept_disagreements"] = disagree
    return record, True


# ---- the command --------------------------------------------------------------------------------

def encode_cases(cases: list[Case], encode: Callable[[str], list[int]]) -> list[list[list[int]]]:
    return [[encode(json.dumps(data, ensure_ascii=False)) for data, _ in case.tests] for case in cases]


def run_suite(cases: list[Case], specs: list[BackendSpec], encode: Callable[[str], list[int]], *,
              vocab_size: int, eos_token_id: int, timeout_s: float, label: str = "",
              log_path: str | None = None) -> dict:
    """Every backend on one suite: {schemas, instances, tokens, backends: {name: summary},
    skipped: {name: why}}."""
    tokens = encode_cases(cases, encode)
    out = {"schemas": len(cases), "instances": sum(len(c.tests) for c in cases),
           "tokens": sum(len(t) for ts in tokens for t in ts), "backends": {}, "skipped": {}}
    for spec in specs:
        print(f"{spec.name} on {label or 'the corpus'} ({len(cases)} schemas) ...", file=sys.stderr,
              flush=True)
        try:
            run = run_backend(spec, cases, tokens, vocab_size=vocab_size, eos_token_id=eos_token_id,
                              timeout_s=timeout_s, label=label, log_path=log_path)
        except BackendUnavailable as e:
            print(f"  skipping {spec.name}: {e}", file=sys.stderr)
            out["skipped"][spec.name] = str(e)
            continue
        out["backends"][spec.name] = run.summary()
    return out


def format_table(title: str, suite: dict) -> str:
    """The side-by-side table of one suite's results."""
    names = list(suite["backends"])
    rows = [f"{title}: {suite['schemas']} schemas, {suite['instances']} instances, "
            f"{suite['tokens']} tokens", f"{'':<22}" + "".join(f"{n:>{COL}}" for n in names)]
    results = [suite["backends"][n] for n in names]
    for outcome in OUTCOMES:
        if outcome == "crash" and not any(r["counts"]["crash"] for r in results):
            continue
        rows.append(f"{outcome.replace('_', ' '):<22}" + "".join(
            f"{r['counts'][outcome]:>{COL - 9}} {r['percent'][outcome]:>7.1f}%" for r in results))

    def fmt(d: dict, keys: tuple[str, ...]) -> str:
        return " / ".join("-" if d[k] is None else f"{d[k]:.3g}" if d[k] < 100 else f"{d[k]:.0f}"
                          for k in keys)
    rows.append(f"{'TTFM p50/p90/p99 ms':<22}" + "".join(
        f"{fmt(r['ttfm_ms'], ('p50', 'p90', 'p99')):>{COL}}" for r in results))
    rows.append(f"{'TBM p50/p99/max us':<22}" + "".join(
        f"{fmt(r['tbm_us'], ('p50', 'p99', 'max')):>{COL}}" for r in results))
    rows.append(f"{'mask/accept disagree':<22}" + "".join(
        f"{r['mask_accept_disagreements']:>{COL}}" for r in results))
    rows.append(f"{'wall s':<22}" + "".join(f"{r['wall_s']:>{COL}.0f}" for r in results))
    for name, r in zip(names, results):
        bad = [k for k, v in r["per_schema"].items() if v["outcome"] == "invalidation_error"]
        if bad:
            rows.append(f"  {name} accepted invalid instances of {len(bad)} schemas, e.g. "
                        + ", ".join(bad[:5]))
    for name, r in zip(names, results):
        if "enforcement" in r:
            e = r["enforcement"]
            rows.append(f"  {name} enforcement report over {e['schemas']} compiled schemas: keywords "
                        + ", ".join(f"{k} {v}" for k, v in e["keywords"].items())
                        + f"; schemas with approximations {e['schemas_with_approximated']}, "
                        f"with ignored keywords {e['schemas_with_ignored']}")
    for name, why in suite["skipped"].items():
        rows.append(f"  {name} skipped: {why}")
    return "\n".join(rows)


def backend_specs(names: list[str], model_dir: Path, lenient: bool) -> tuple[list[BackendSpec], dict]:
    """Specs for the installed backends, and {name: why} for those skipped."""
    specs, skipped = [], {}
    for name in names:
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {name!r}: expected some of {', '.join(BACKENDS)}")
        if importlib.util.find_spec(MODULES[name]) is None:
            skipped[name] = f"{MODULES[name]} is not installed (pip install -e '.[bench]')"
            print(f"note: skipping {name}: {skipped[name]}", file=sys.stderr)
            continue
        options = {"model_dir": str(model_dir), "lenient": lenient} if name == "gdserve" \
            else {"model_dir": str(model_dir)}
        specs.append(BackendSpec("gdserve-lenient" if name == "gdserve" and lenient else name,
                                 make_backend, {"name": name, **options}))
    return specs, skipped


def _versions() -> dict:
    out = {}
    for dist in ("gdserve", "llguidance", "xgrammar", "outlines_core", "torch", "transformers"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def cmd_maskbench(args: argparse.Namespace) -> None:
    from gdserve.models import load_tokenizer, resolve_model
    suites = list(SUITES) if args.suite == "both" else [args.suite]
    dirs = default_dirs()
    if args.dir:
        dirs["maskbench"] = Path(args.dir)
    if args.jsts_dir:
        dirs["jsts"] = Path(args.jsts_dir)
    loaders = {"maskbench": load_maskbench, "jsts": load_jsts}
    if args.every < 1:
        raise ValueError(f"--every must be at least 1, got {args.every}")
    # Loaded first: a missing corpus fails before the tokenizer loads.
    corpora = {s: loaders[s](dirs[s], args.limit, args.every) for s in suites}
    model_dir = resolve_model(args.model)
    tokenizer = load_tokenizer(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    vocab_size = max(config.get("vocab_size", 0), len(tokenizer))
    eos = tokenizer.eos_token_id
    specs, skipped = backend_specs([b.strip() for b in args.backends.split(",") if b.strip()],
                                   model_dir, args.lenient)
    if not specs:
        raise ValueError("none of the requested backends is installed")
    result = {"command": " ".join(["gdserve"] + sys.argv[1:]), "model": args.model,
              "model_dir": str(model_dir), "vocab_size": vocab_size, "eos_token_id": eos,
              "timeout_s": args.timeout_s, "limit": args.limit, "every": args.every,
              "versions": _versions(),
              "machine": platform.processor() or platform.machine(), "not_installed": skipped,
              "suites": {}}
    log_path = Path(args.output).with_suffix(".log") if args.output else \
        Path(tempfile.gettempdir()) / f"gdserve-maskbench-{os.getpid()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    print(f"the backends' own warnings and errors go to {log_path}", file=sys.stderr)
    start = time.perf_counter()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)
    for suite in suites:
        result["suites"][suite] = {"dir": str(dirs[suite]), **run_suite(
            corpora[suite], specs, encode, vocab_size=vocab_size, eos_token_id=eos,
            timeout_s=args.timeout_s, label=suite, log_path=str(log_path))}
    result["runtime_s"] = round(time.perf_counter() - start, 1)
    for suite in suites:
        print(format_table({"maskbench": "MaskBench dev", "jsts": "JSON-Schema-Test-Suite "
                            "draft2020-12"}[suite], result["suites"][suite]) + "\n")
    for name, r in next(iter(result["suites"].values()))["backends"].items():
        print(f"{name}: {r['settings']}")
    print(f"runtime {result['runtime_s']:.0f} s")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.output}", file=sys.stderr)


def add_maskbench_parser(sub) -> None:
    p = sub.add_parser("maskbench", help="score JSON Schema constraint compilers (gdserve and peers) "
                                         "by the MaskBench method")
    p.add_argument("dir", nargs="?", help="MaskBench corpus folder "
                                          "(default: ../shared/conformance/maskbench-dev)")
    p.add_argument("--jsts-dir", help="JSON-Schema-Test-Suite folder of test files (default: "
                                      "../shared/conformance/json-schema-test-suite/tests/draft2020-12)")
    p.add_argument("--suite", choices=["maskbench", "jsts", "both"], default="maskbench")
    p.add_argument("--model", default=DEFAULT_MODEL, help="whose tokenizer to use")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, of "
                                                                  + ", ".join(BACKENDS))
    p.add_argument("--limit", type=int, help="the first N schemas of each suite (sorted by file)")
    p.add_argument("--every", type=int, default=1, help="every K-th schema of each suite (sorted by "
                   "file; a spread-out sample, before --limit)")
    p.add_argument("--timeout-s", type=float, default=10.0,
                   help="limit for each compile and for each instance's check")
    p.add_argument("--lenient", action="store_true",
                   help="gdserve relaxes unsupported keywords instead of failing the compile")
    p.add_argument("--output", help="write the results (with per-schema outcomes) to this JSON file")
    p.set_defaults(func=cmd_maskbench)
