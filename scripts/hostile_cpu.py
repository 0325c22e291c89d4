"""Ordinary requests beside hostile constraints, over HTTP, on the CPU: does one request's matcher
work stall the others? Starts `gdserve serve` (the default model), then sends ORDINARY (guided and
unguided chat requests, greedy) alone, beside as many BENIGN unguided requests (the batch grown as
much, no matcher work), and beside the HOSTILE constraints (ReDoS patterns, a 20,000-value enum, a
3,000-branch anyOf, $ref loops, a remote $ref, an ambiguous grammar, big bounded arrays, ...), all
at once, while /health is polled. Reports each ordinary request's latency alone and beside each,
their ratios (target: the slowest within 1.5x of alone beside the hostile ones), /health's worst
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


def hostile(salt: int = 0) -> list[tuple[str, dict]]:
    """(name, request fields beyond model and messages) of constraints built to be slow or refused,
    spelled apart by `salt` (the same languages): each round's are new to the server's caches."""
    def schema(name: str, s: object) -> dict:
        s = {**s, "$comment": f"round {salt}"} if isinstance(s, dict) else s
        return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": s}}}

    def regex(pattern: str) -> dict:
        return {"guided_regex": "(?:" * salt + pattern + ")" * salt}
    nested: dict = {"type": "string"}
    for i in range(150):
        nested = {"type": "object", "properties": {f"level{i}": nested}, "required": [f"level{i}"]}
    return [
        ("redos_nested_plus", regex(r"(a+)+")),
        ("redos_alternation", regex(r"(a|aa)+b")),
        ("dfa_blowup", regex(r"(.*a){24}")),
        ("regex_huge_repeat", regex(r"([a-z]{100}){100}")),
        ("regex_lookahead", regex(r"(?=abc)abc")),
        ("enum_20000", schema("enum", {"enum": [f"value_{i:05d}" for i in range(20000)]})),
        ("anyof_3000", schema("anyof", {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                                                   "required": [f"k{i}"]} for i in range(3000)]})),
        ("ref_loop", schema("loop", {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                     "$ref": "#/$defs/a"})),
        ("remote_ref", schema("remote", {"$ref": "https://example.com/schemas/person.json"})),
        ("grammar_ambiguous", {"guided_grammar": f'start: x+\nx: "a" | "a" "a" | "a" "a" "a"\n// round {salt}'}),
        ("array_2000_to_5000", schema("array", {"type": "array", "items": {"type": "string", "maxLength": 5},
                                                "minItems": 2000, "maxItems": 5000})),
        ("nested_150", schema("nested", nested)),
        ("choice_5000", {"guided_choice": [f"option number {i} " + "x" * (i % 50) for i in range(5000)]
                         + [f"round {salt}"]}),
        ("open_pattern_keys", schema("keys", {"type": "object", "patternProperties": {
            f"^p{i}_[a-z]{{2,{8 + i % 5}}}$": {"type": "integer", "minimum": i} for i in range(60)}})),
    ]


def benign(count: int) -> list[tuple[str, dict]]:
    """`count` unguided requests (as many as the hostile ones), each running to max_tokens: the
    load of a batch that grew as much, without any matcher work."""
    return [(f"benign_{i}", {"prompt": f"Count from {i} upwards.", "ignore_eos": True}) for i in range(count)]


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


async def one_round(url: str, beside: list[tuple[str, dict]]) -> dict:
    """The ordinary requests, and `beside` them the given ones, all at once."""
    import aiohttp
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        stop_event = asyncio.Event()
        health = asyncio.create_task(poll_health(session, url, stop_event))
        plain = ordinary()
        jobs = [send(session, url, n, f) for n, f in plain + beside]
        start_s = time.perf_counter()
        results = await asyncio.gather(*jobs)
        wall = time.perf_counter() - start_s
        stop_event.set()
        health_s = await health
    plain = results[:len(plain)]
    return {"wall_s": round(wall, 3), "ordinary": plain, "beside": results[len(plain):],
            "ordinary_max_s": max(r["seconds"] for r in plain),
            "ordinary_mean_s": round(statistics.mean(r["seconds"] for r in plain), 3),
            "health_max_ms": round(1e3 * max(health_s, default=0.0), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of alone / benign / hostile (the median of each is reported)")
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
        asyncio.run(one_round(url, []))  # warm-up: compiles the ordinary schemas, as a server that ran a while has
        rounds = []
        for salt in range(1, args.rounds + 1):
            crowd = hostile(salt)
            rounds.append({"alone": asyncio.run(one_round(url, [])),
                           "benign": asyncio.run(one_round(url, benign(len(crowd)))),
                           "hostile": asyncio.run(one_round(url, crowd))})
    finally:
        stop(proc)
    # the median round of each (every round's hostile constraints are new to the server)
    median = {kind: sorted((r[kind] for r in rounds), key=lambda r: r["ordinary_max_s"])[(len(rounds) - 1) // 2]
              for kind in rounds[0]}
    alone = median["alone"]

    def ratio(kind: str, key: str) -> float:
        return round(median[kind][key] / alone[key], 3)
    result = {"date": datetime.date.today().isoformat(), "commit": git_commit(),
              "machine": platform.processor() or platform.machine(),
              "command": " ".join([sys.executable, *sys.argv]), "serve_flags": serve_flags,
              "max_tokens": MAX_TOKENS, **median,
              "ratio_max": {k: ratio(k, "ordinary_max_s") for k in ("benign", "hostile")},
              "ratio_mean": {k: ratio(k, "ordinary_mean_s") for k in ("benign", "hostile")},
              "rounds": [{k: r[k]["ordinary_max_s"] for k in r} for r in rounds]}
    print(f"ordinary requests alone: mean {alone['ordinary_mean_s']:.2f} s, slowest {alone['ordinary_max_s']:.2f} s")
    for kind in ("benign", "hostile"):
        r = median[kind]
        print(f"beside {len(r['beside'])} {kind} ones: mean {r['ordinary_mean_s']:.2f} s, "
              f"slowest {r['ordinary_max_s']:.2f} s = {result['ratio_max'][kind]:.2f}x"
              f"{' (target <= 1.5x)' if kind == 'hostile' else ''}; /health worst {r['health_max_ms']:.0f} ms")
    for r in median["hostile"]["beside"]:
        print(f"  {r['name']:<20} HTTP {r['status']} in {r['seconds']:6.2f} s, {r['tokens']} tokens: {r['said']}")
    write_result(result, args.output)


if __name__ == "__main__":
    main()
