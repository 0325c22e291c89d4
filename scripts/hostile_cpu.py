"""Ordinary requests beside hostile constraints, over HTTP, on the CPU: does one request's matcher
work stall the others? Starts `gdserve serve` (the default model), then sends ORDINARY (guided and
unguided chat requests, greedy) alone, and the same again beside the HOSTILE constraints (ReDoS
patterns, a 20,000-value enum, a 3,000-branch anyOf, $ref loops, a remote $ref, an ambiguous
grammar, big bounded arrays, ...), all at once, while /health is polled. Reports each ordinary
request's latency alone and beside, their ratio (target: the slowest within 1.5x), /health's worst
latency, and each hostile request's HTTP status and what it said. Usage:

    python scripts/hostile_cpu.py [--rounds N] [--output FILE] [-- gdserve serve flags]
"""
import argparse
import asyncio
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from llamacpp_cpu import ServerSpec, free_port, start, stop

from gdserve.bench.results import git_commit, write_result
from gdserve.models.registry import DEFAULT_MODEL

MAX_TOKENS = 96
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
ORDINARY_SCHEMAS = ["user_profile.json", "calendar_event.json", "classification.json", "movie.json",
                    "bank_transaction.json", "recipe.json"]
ORDINARY_PROMPTS = ["Describe a person who lives in Lisbon.", "Plan a team meeting next week.",
                    "Classify this review: the battery died after a day.", "Tell me about a science fiction film.",
                    "Record a card payment of 42 euros at a bakery.", "Give me a recipe for pancakes."]


def hostile() -> list[tuple[str, dict]]:
    """(name, request fields beyond model and messages) of constraints built to be slow or refused."""
    def schema(name: str, s: object) -> dict:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": s}}}
    nested: dict = {"type": "string"}
    for i in range(150):
        nested = {"type": "object", "properties": {f"level{i}": nested}, "required": [f"level{i}"]}
    return [
        ("redos_nested_plus", {"guided_regex": r"(a+)+$"}),
        ("redos_alternation", {"guided_regex": r"(a|aa)+b"}),
        ("dfa_blowup", {"guided_regex": r"(.*a){24}"}),
        ("regex_huge_repeat", {"guided_regex": r"([a-z]{100}){100}"}),
        ("regex_lookahead", {"guided_regex": r"(?=abc)abc"}),
        ("enum_20000", schema("enum", {"enum": [f"value_{i:05d}" for i in range(20000)]})),
        ("anyof_3000", schema("anyof", {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                                                   "required": [f"k{i}"]} for i in range(3000)]})),
        ("ref_loop", schema("loop", {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                     "$ref": "#/$defs/a"})),
        ("remote_ref", schema("remote", {"$ref": "https://example.com/schemas/person.json"})),
        ("grammar_ambiguous", {"guided_grammar": 'start: x+\nx: "a" | "a" "a" | "a" "a" "a"'}),
        ("array_2000_to_5000", schema("array", {"type": "array", "items": {"type": "string", "maxLength": 5},
                                                "minItems": 2000, "maxItems": 5000})),
        ("nested_150", schema("nested", nested)),
        ("choice_5000", {"guided_choice": [f"option number {i} " + "x" * (i % 50) for i in range(5000)]}),
        ("open_pattern_keys", schema("keys", {"type": "object", "patternProperties": {
            f"^p{i}_[a-z]{{2,{8 + i % 5}}}$": {"type": "integer", "minimum": i} for i in range(60)}})),
    ]


def ordinary() -> list[tuple[str, dict]]:
    out = []
    for name, prompt in zip(ORDINARY_SCHEMAS, ORDINARY_PROMPTS):
        s = json.loads((SCHEMAS / name).read_text())
        out.append((f"guided_{name[:-5]}", {"prompt": prompt, "response_format": {
            "type": "json_schema", "json_schema": {"name": name[:-5], "schema": s}}}))
        out.append((f"unguided_{name[:-5]}", {"prompt": prompt}))
    return out


async def send(session, url: str, name: str, fields: dict) -> dict:
    body = {"model": DEFAULT_MODEL, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "messages": [{"role": "user", "content": fields.get("prompt", "Answer.")}],
            **{k: v for k, v in fields.items() if k != "prompt"}}
    start_s = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        text = await response.text()
    seconds = time.perf_counter() - start_s
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
    said = (data.get("error") or {}).get("message") if response.status != 200 else \
        (data.get("choices") or [{}])[0].get("finish_reason")
    tokens = (data.get("usage") or {}).get("completion_tokens")
    return {"name": name, "status": response.status, "seconds": round(seconds, 3), "tokens": tokens,
            "said": str(said)[:200]}


async def poll_health(session, url: str, stop_event: asyncio.Event) -> list[float]:
    latencies = []
    while not stop_event.is_set():
        start_s = time.perf_counter()
        async with session.get(f"{url}/health") as response:
            await response.read()
        latencies.append(time.perf_counter() - start_s)
        await asyncio.sleep(0.25)
    return latencies


async def one_round(url: str, with_hostile: bool) -> dict:
    import aiohttp
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        stop_event = asyncio.Event()
        health = asyncio.create_task(poll_health(session, url, stop_event))
        jobs = [send(session, url, n, f) for n, f in ordinary()]
        if with_hostile:
            jobs += [send(session, url, n, f) for n, f in hostile()]
        start_s = time.perf_counter()
        results = await asyncio.gather(*jobs)
        wall = time.perf_counter() - start_s
        stop_event.set()
        health_s = await health
    plain = results[:len(ordinary())]
    return {"wall_s": round(wall, 3), "ordinary": plain, "hostile": results[len(plain):],
            "ordinary_max_s": max(r["seconds"] for r in plain),
            "ordinary_mean_s": round(statistics.mean(r["seconds"] for r in plain), 3),
            "health_max_ms": round(1e3 * max(health_s, default=0.0), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2, help="alone / beside pairs (the best of each is kept)")
    parser.add_argument("--output", default="bench-results/hostile_cpu.json")
    args, serve_flags = parser.parse_known_args()
    serve_flags = [f for f in serve_flags if f != "--"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = ServerSpec("gdserve", [sys.executable, "-m", "gdserve.entrypoints.cli", "serve", DEFAULT_MODEL,
                                  "--log-level", "warning", *serve_flags])
    log = Path(tempfile.gettempdir()) / f"hostile_cpu_{port}.log"
    proc = start(spec, port, log, threads=0)
    try:
        asyncio.run(one_round(url, False))  # warm-up: compiles the ordinary schemas, as a server that ran a while has
        rounds = [(asyncio.run(one_round(url, False)), asyncio.run(one_round(url, True))) for _ in range(args.rounds)]
    finally:
        stop(proc)
    alone = min((a for a, _ in rounds), key=lambda r: r["ordinary_max_s"])
    beside = min((b for _, b in rounds), key=lambda r: r["ordinary_max_s"])
    result = {"date": datetime.date.today().isoformat(), "commit": git_commit(),
              "machine": platform.processor() or platform.machine(), "command": " ".join([sys.executable, *sys.argv]), "serve_flags": serve_flags,
              "max_tokens": MAX_TOKENS, "alone": alone, "beside": beside,
              "ratio_max": round(beside["ordinary_max_s"] / alone["ordinary_max_s"], 3),
              "ratio_mean": round(beside["ordinary_mean_s"] / alone["ordinary_mean_s"], 3),
              "rounds": [{"alone_max_s": a["ordinary_max_s"], "beside_max_s": b["ordinary_max_s"]} for a, b in rounds]}
    print(f"ordinary requests alone: mean {alone['ordinary_mean_s']:.2f} s, slowest {alone['ordinary_max_s']:.2f} s; "
          f"beside the hostile ones: mean {beside['ordinary_mean_s']:.2f} s, slowest {beside['ordinary_max_s']:.2f} s "
          f"= {result['ratio_max']:.2f}x (target <= 1.5x); /health worst {beside['health_max_ms']:.0f} ms")
    for r in beside["hostile"]:
        print(f"  {r['name']:<20} HTTP {r['status']} in {r['seconds']:6.2f} s, {r['tokens']} tokens: {r['said']}")
    write_result(result, args.output)


if __name__ == "__main__":
    main()
