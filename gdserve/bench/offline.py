"""The offline engine as the throughput benches run it: loaded and warmed, then timed."""
import time

from gdserve.bench.results import rate


def timed_generate(llm, prompts: list[dict], params: list, lora_request: list | None = None) -> tuple[dict, list]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=lora_request)
    seconds = time.perf_counter() - start
    return rate(sum(len(o.outputs[0].token_ids) for o in outputs), seconds), outputs


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
