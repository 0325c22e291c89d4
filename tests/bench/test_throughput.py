"""`gdserve bench throughput`'s runs on the tiny model: what each reports, and that the warm-up
leaves the engine as the timed runs need it (no cached prompt, no block held)."""
import gc
import weakref

import pytest

from gdserve.bench.offline import collect_engines, warm_llm
from gdserve.bench.throughput import run_engine, run_guided_vs_unguided
from gdserve.utils import settle_gc

ENGINE_ARGS = {"dtype": "float32", "max_num_batched_tokens": 64, "kv_cache_memory": 1 << 22, "block_size": 4,
               "grammar_compile_timeout_s": 60}


def requests(n: int, max_tokens: int) -> list[dict]:
    return [{"id": i, "prompt_ids": [(7 * i + j) % 250 + 3 for j in range(5 + 3 * i)], "max_tokens": max_tokens + i}
            for i in range(n)]


def test_warm_up_leaves_nothing_cached(tiny_llama_dir):
    work = requests(6, 4)
    prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in work]
    llm = warm_llm(str(tiny_llama_dir), ENGINE_ARGS, prompts)
    stats = llm.engine.stats()
    assert stats.prefix_cache_queries > 0 and stats.num_used_blocks == 0  # it ran, and let go
    assert stats.num_running == stats.num_waiting == 0
    from gdserve import SamplingParams
    outputs = llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0))
    assert [o.num_cached_tokens for o in outputs] == [0] * len(prompts)


def test_a_closed_warm_engine_is_collected(tiny_llama_dir):
    """warm_llm freezes the engine's objects out of collection (gc.freeze): an engine in a
    reference cycle at that point (one of CUDA's outlived a closed engine's del and gc.collect,
    and its KV cache filled the device) is freed by collect_engines."""
    llm = warm_llm(str(tiny_llama_dir), ENGINE_ARGS, [{"prompt_token_ids": [5, 6, 7]}])
    llm.engine.itself = llm.engine
    settle_gc()  # the cycle frozen with the rest, as warm-up freezes an engine's own
    engine = weakref.ref(llm.engine)
    llm.engine.close()
    del llm
    gc.collect()
    assert engine() is not None
    collect_engines()
    assert engine() is None


def test_engine_run_reports_every_requested_token(tiny_llama_dir):
    work = requests(5, 6)
    result = run_engine(work, str(tiny_llama_dir), ENGINE_ARGS)
    assert result["output_tokens"] == sum(r["max_tokens"] for r in work)  # ignore_eos: each runs to max_tokens
    assert result["tokens_per_s"] == pytest.approx(result["output_tokens"] / result["seconds"])


def test_guided_and_unguided_runs_do_the_same_work(tiny_llama_dir):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 6}},
              "required": ["a", "b"]}
    work = [{**r, "json_schema": schema} for r in requests(4, 40)]
    result = run_guided_vs_unguided(work, str(tiny_llama_dir), ENGINE_ARGS)
    assert result["guided"]["output_tokens"] == result["unguided"]["output_tokens"] > 0
    assert result["ratio"] == pytest.approx(result["guided"]["tokens_per_s"] / result["unguided"]["tokens_per_s"])
