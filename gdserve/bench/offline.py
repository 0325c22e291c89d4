"""The offline engine as the throughput benches run it: loaded and warmed, then timed."""
import gc
import time

import torch

from gdserve.bench.results import rate


def greedy_inputs(requests: list[dict]) -> tuple[list[dict], list]:
    """A standard workload's requests as engine prompts and parameters: greedy, each request to
    its max_tokens (EOS ignored)."""
    from gdserve import SamplingParams
    prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in requests]
    return prompts, [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, ignore_eos=True) for r in requests]


def timed_generate(llm, prompts: list[dict], params: list, lora_request: list | None = None) -> tuple[dict, list]:
    steps_before = llm.engine.num_forward_steps
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=lora_request)
    seconds = time.perf_counter() - start
    return run_rate(llm.engine, outputs, seconds, steps_before), outputs


def run_rate(engine, outputs: list, seconds: float, steps_before: int) -> dict:
    """Output tokens per second of a run, the forward steps it took (the engine's count less
    steps_before) and the share of its output tokens that were forced (no step each)."""
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    forced = sum(o.outputs[0].num_forced_tokens for o in outputs)
    return {**rate(tokens, seconds), "forward_steps": engine.num_forward_steps - steps_before,
            "forced_share": round(forced / tokens, 4) if tokens else None}


def warm_llm(model: str, engine_args: dict, prompts: list[dict], lora_requests: list | None = None):
    """The engine, loaded and run once (its prefix cache then emptied: the first timed run would
    find that prompt cached), with the garbage collector settled as the server settles it once
    its engine has loaded. With lora_requests, the first prompt runs once with each adapter, so
    every adapter is read and in a slot before the clock starts."""
    from gdserve import LLM, SamplingParams
    from gdserve.utils import settle_gc
    llm = LLM(model, **engine_args)
    if lora_requests:
        llm.generate(prompts[:1] * len(lora_requests), SamplingParams(max_tokens=2), lora_request=lora_requests,
                     use_tqdm=False)
    else:
        llm.generate(prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.engine.kv_cache.reset_prefix_cache()
    settle_gc()
    return llm


def timed_run(requests: list[dict], model: str, engine_args: dict, lora_requests: list | None = None) -> dict:
    """One engine, warmed, over the workload (greedy, each request to its max_tokens; request i
    with adapter i mod len(lora_requests)), then let go, so that the next engine finds the memory
    free. Records the KV blocks and the preemptions beside the rate."""
    prompts, params = greedy_inputs(requests)
    per_request = [lora_requests[i % len(lora_requests)] for i in range(len(requests))] if lora_requests else None
    llm = warm_llm(model, engine_args, prompts, lora_requests)
    run, _ = timed_generate(llm, prompts, params, per_request)
    stats = llm.engine.stats()
    run.update(num_kv_blocks=stats.num_blocks, num_preemptions=stats.num_preemptions,
               num_swap_outs=llm.engine.scheduler.num_swap_outs)
    llm.engine.close()
    del llm
    collect_engines()
    return run


def collect_engines() -> None:
    """Free the memory of engines closed and no longer referenced: warm_llm froze their objects
    out of collection (gc.freeze), and an engine's reference cycles hold its KV cache until
    they are collected."""
    gc.unfreeze()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
