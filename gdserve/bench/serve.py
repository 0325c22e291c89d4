"""`gdserve bench serve`: a load generator against a running server, with vLLM benchmark_serving's
metrics. Each request of a standard workload goes to /v1/completions as prompt token ids, streamed,
greedy, EOS ignored, with its own max_tokens; arrivals are Poisson at --request-rate (all at once by
default), at most --max-concurrency in flight.

TTFT: request start to the first text chunk. TPOT: (latency - TTFT) / (output tokens - 1), per
request with more than one token. ITL: the gaps between successive chunks (a chunk can carry more
than one token when the server batches its output). E2EL: request start to the last chunk.
The offline figure to compare with comes from `gdserve bench throughput --skip-hf --output FILE` on
the same workload (--offline-result FILE prints the ratio).
"""
import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gdserve.bench import workloads
from gdserve.engine.progress import GenerationProgress


@dataclass
class RequestResult:
    prompt_len: int
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str | None = None


def build_requests(args: argparse.Namespace) -> list[dict]:
    """The workload, optionally scaled down for a small test model (ids modulo its vocabulary,
    prompts and outputs clipped)."""
    make = {"cpu": workloads.cpu_workload, "random": workloads.random_workload}[args.workload]
    requests = make(n=args.num_requests) if args.num_requests else make()
    for r in requests:
        ids = r["prompt_ids"][:args.max_prompt_len] if args.max_prompt_len else r["prompt_ids"]
        r["prompt_ids"] = [i % args.vocab_size for i in ids] if args.vocab_size else ids
        if args.max_output_len:
            r["max_tokens"] = min(r["max_tokens"], args.max_output_len)
    return requests


async def send(session, url: str, model: str, request: dict) -> RequestResult:
    """One streamed completion, read as raw SSE lines (as vLLM's benchmark does): the client shares
    the server's cores here, so it must cost little per chunk."""
    result = RequestResult(len(request["prompt_ids"]))
    body = {"model": model, "prompt": request["prompt_ids"], "max_tokens": request["max_tokens"],
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    start = last = time.perf_counter()
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"].get("message", chunk["error"]))
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.output_len = chunk["usage"]["completion_tokens"]
        result.latency = last - start
    except Exception as e:  # noqa: BLE001  (a failed request is counted, not fatal)
        result.error = f"{type(e).__name__}: {e}"
    return result


async def run_load(session, url: str, model: str, requests: list[dict], rate: float, max_concurrency: int | None,
                   seed: int) -> tuple[list[RequestResult], float]:
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    rng = random.Random(seed)
    progress = GenerationProgress(len(requests), desc="Requests done")

    async def limited(request: dict) -> RequestResult:
        if limit is None:
            result = await send(session, url, model, request)
        else:
            async with limit:
                result = await send(session, url, model, request)
        progress.update(result.prompt_len, result.output_len)
        return result

    tasks = []
    start = time.perf_counter()
    for request in requests:
        tasks.append(asyncio.create_task(limited(request)))
        if math.isfinite(rate):
            await asyncio.sleep(rng.expovariate(rate))
    results = await asyncio.gather(*tasks)
    progress.close()
    return results, time.perf_counter() - start


def summarize(results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.error is None]
    inputs, outputs = sum(r.prompt_len for r in ok), sum(r.output_len for r in ok)
    summary = {"completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
               "total_input_tokens": inputs, "total_output_tokens": outputs,
               "request_throughput": len(ok) / duration, "output_throughput": outputs / duration,
               "total_token_throughput": (inputs + outputs) / duration}
    series = {"ttft": [r.ttft for r in ok],
              "tpot": [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1],
              "itl": [x for r in ok for x in r.itl],
              "e2el": [r.latency for r in ok]}
    for name, values in series.items():
        ms = np.array(values or [0.0]) * 1000
        summary |= {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
                    f"std_{name}_ms": float(ms.std()), f"p99_{name}_ms": float(np.percentile(ms, 99))}
    errors = [r.error for r in results if r.error is not None]
    if errors:
        summary["errors"] = errors[:5]
    return summary


async def _bench(args: argparse.Namespace, requests: list[dict]) -> dict:
    try:
        import aiohttp
    except ImportError:
        raise ValueError("gdserve bench serve needs the aiohttp package: pip install aiohttp") from None
    base = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"}
    timeout = aiohttp.ClientTimeout(total=6 * 3600)
    # The semaphore, not the pool, bounds concurrency. A connection per request: llama.cpp's server
    # closes a connection after a streamed response, and a request sent on it is lost.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as session:
        model = args.model or await _first_model(session, base)
        url = f"{base}/completions"
        warm = await send(session, url, model, {"prompt_ids": requests[0]["prompt_ids"], "max_tokens": 2})
        if warm.error is not None:
            raise ValueError(f"the warm-up request to {url} failed: {warm.error}")
        results, duration = await run_load(session, url, model, requests, args.request_rate,
                                           args.max_concurrency, args.seed)
    return {"model": model, **summarize(results, duration)}


async def _first_model(session, base: str) -> str:
    try:
        async with session.get(f"{base}/models") as response:
            response.raise_for_status()
            return (await response.json())["data"][0]["id"]
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"cannot list the models at {base}/models: {e}") from None


def parse_serve_bench_args(argv: list[str]) -> argparse.Namespace:
    """`gdserve bench serve`'s flags from a list, with its defaults, for a script that drives the bench."""
    parser = argparse.ArgumentParser(prog="gdserve bench")
    add_serve_bench_parser(parser.add_subparsers(dest="bench", required=True))
    return parser.parse_args(["serve", *argv])


def run_serve_bench(args: argparse.Namespace) -> dict:
    """Loads the server at args.base_url with the workload and returns the figures (printed too)."""
    requests = build_requests(args)
    offline = load_offline(Path(args.offline_result), args.workload, len(requests)) if args.offline_result else None
    print(f"{len(requests)} requests to {args.base_url} (rate {args.request_rate}/s, max concurrency "
          f"{args.max_concurrency or 'unlimited'}) ...", file=sys.stderr, flush=True)
    result = {"command": " ".join(["gdserve"] + sys.argv[1:]), "base_url": args.base_url,
              "workload": args.workload, "num_requests": len(requests),
              "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
              "max_concurrency": args.max_concurrency}
    result |= _run_event_loop(_bench(args, requests))
    if offline is not None:
        result |= {"offline_output_throughput": offline,
                   "server_over_offline": result["output_throughput"] / offline}
    _print(result)
    return result


def cmd_serve_bench(args: argparse.Namespace) -> None:
    result = run_serve_bench(args)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.output}", file=sys.stderr)


def _run_event_loop(main):
    """uvloop where installed (uvicorn[standard] brings it): the client shares the cores it measures."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def load_offline(path: Path, workload: str, num_requests: int) -> float:
    """The offline engine's output tokens/s from a `gdserve bench throughput` JSON of the same work."""
    offline = json.loads(path.read_text())
    if (offline.get("workload"), offline.get("num_requests")) != (workload, num_requests):
        raise ValueError(f"{path} is workload {offline.get('workload')} x {offline.get('num_requests')}, this run "
                         f"is {workload} x {num_requests}: compare the same work")
    return offline["engine"]["tokens_per_s"]


def _print(r: dict) -> None:
    print(f"completed {r['completed']} / {r['num_requests']} requests in {r['duration_s']:.1f} s"
          + (f" ({r['failed']} failed: {r['errors'][0]})" if r["failed"] else ""))
    print(f"request throughput {r['request_throughput']:.2f} req/s, output {r['output_throughput']:.1f} tok/s, "
          f"total {r['total_token_throughput']:.1f} tok/s")
    for name in ("ttft", "tpot", "itl", "e2el"):
        print(f"{name.upper():>5} ms: mean {r[f'mean_{name}_ms']:.1f}, median {r[f'median_{name}_ms']:.1f}, "
              f"p99 {r[f'p99_{name}_ms']:.1f}")
    if "server_over_offline" in r:
        print(f"server / offline output throughput: {r['server_over_offline']:.2f}x "
              f"({r['offline_output_throughput']:.1f} tok/s offline)")


def add_serve_bench_parser(sub) -> None:
    p = sub.add_parser("serve", help="load-test a running server (vLLM benchmark_serving metrics)")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="the served model name (default: the server's first model)")
    p.add_argument("--api-key", default="EMPTY")
    p.add_argument("--workload", choices=["cpu", "random"], default="cpu")
    p.add_argument("--num-requests", type=int)
    p.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (default: all at once)")
    p.add_argument("--max-concurrency", type=int, help="at most this many requests in flight")
    p.add_argument("--seed", type=int, default=0, help="seeds the arrival times")
    p.add_argument("--vocab-size", type=int, help="take prompt ids modulo this (small test models)")
    p.add_argument("--max-prompt-len", type=int, help="clip prompts to this many tokens (small test models)")
    p.add_argument("--max-output-len", type=int, help="clip max_tokens (small test models)")
    p.add_argument("--offline-result", help="a `gdserve bench throughput --skip-hf --output` JSON of the same "
                                            "workload: report server / offline throughput")
    p.add_argument("--output", help="write the figures to this JSON file")
    p.set_defaults(func=cmd_serve_bench)
