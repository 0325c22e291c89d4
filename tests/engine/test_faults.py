"""Faults inside the engine: an exception in one request's share of a step (its grammar matcher,
its detokenizer) fails that request alone; a failed forward fails the requests of its step; the
others finish exactly as they would have, every block is freed, and the engine takes new requests.
Through AsyncLLM the failed request's caller gets RequestFailed; a shut-down engine fails what is in
flight with EngineDeadError and refuses what comes after."""
import asyncio
import itertools
from dataclasses import dataclass, field

import pytest

from gdserve import LLM, SamplingParams
from gdserve.config import EngineConfig
from gdserve.engine.async_llm import AsyncLLM, EngineDeadError, RequestFailed
from gdserve.engine.detokenizer import IncrementalDetokenizer
from gdserve.engine.llm_engine import LLMEngine
from gdserve.engine.request import PLACEHOLDER
from gdserve.grammar import Grammar, compile_grammar
from gdserve.outputs import RequestOutput
from gdserve.sampling_params import StructuredOutputsParams
from tests.engine.test_llm import assert_no_leaks
from tests.entrypoints.openai.observe import is_running, wait_until

REGEX = "[a-z]{4,12}"
MAX_STEPS = 300
FAULT_MARKER = "<injected fault>"  # a stop string that singles out the request whose detokenizer fails


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    grammar: object = None


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def failing_on_call(n: int, fn):
    """fn, except that its n-th call raises."""
    calls = itertools.count(1)

    def call(*args, **kw):
        if next(calls) == n:
            raise RuntimeError("injected fault")
        return fn(*args, **kw)
    return call


class FaultyMatcher:
    """A Matcher whose `method` raises on its fail_at-th call."""

    def __init__(self, matcher, method: str, fail_at: int):
        self.matcher, self.method = matcher, method
        self.failing = failing_on_call(fail_at, getattr(matcher, method))

    def __getattr__(self, name: str):
        return self.failing if name == self.method else getattr(self.matcher, name)


@dataclass
class FaultyGrammar:
    """A compiled grammar whose matchers fail (add_request takes any grammar): method "matcher"
    fails creating one, a Matcher method name fails that method on its fail_at-th call."""
    grammar: Grammar
    method: str
    fail_at: int = 3

    def matcher(self) -> FaultyMatcher:
        if self.method == "matcher":
            raise RuntimeError("injected fault in matcher()")
        return FaultyMatcher(self.grammar.matcher(), self.method, self.fail_at)


# Where each fault strikes, as the failed request's error names it.
STAGES = {"matcher": "creating its grammar matcher", "next_token_row": "computing its grammar mask",
          "accept_token": "processing its sampled token", "detokenizer": "processing its sampled token"}


def faulty_request(fault: str, grammar: Grammar, monkeypatch) -> Request:
    if fault != "detokenizer":
        return Request([9, 10, 11], greedy(16), FaultyGrammar(grammar, fault))
    append = IncrementalDetokenizer.append

    def failing_append(self, token_id: int) -> str:
        if FAULT_MARKER in self.stop and len(self.token_ids) > 8:
            raise RuntimeError("injected fault in the detokenizer")
        return append(self, token_id)

    monkeypatch.setattr(IncrementalDetokenizer, "append", failing_append)
    return Request([9, 10, 11], greedy(16, stop=[FAULT_MARKER]))


def run(engine: LLMEngine, requests: dict[str, Request]) -> dict[str, RequestOutput]:
    """Add the requests, step until every one has finished; their final outputs by name."""
    names = {engine.add_request(r.prompt, r.params, grammar=r.grammar): name for name, r in requests.items()}
    finished: dict[str, RequestOutput] = {}
    for _ in range(MAX_STEPS):
        for out in engine.step():
            if out.finished:
                finished[names[out.request_id]] = out
        if len(finished) == len(names):
            return finished
    raise AssertionError(f"{set(names.values()) - set(finished)} did not finish in {MAX_STEPS} steps")


def assert_failed(out: RequestOutput, stage: str) -> None:
    assert out.error is not None and stage in out.error and "RuntimeError" in out.error, out.error
    assert all(c.finish_reason == "error" and PLACEHOLDER not in c.token_ids for c in out.outputs)


@pytest.fixture(scope="module", params=[(False, 0), (True, 0), (True, 2)],
                ids=["sync", "async_scheduling", "mask_workers"])
def llm(tiny_llama_dir, request):
    async_scheduling, mask_workers = request.param
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22, block_size=4,
              async_scheduling=async_scheduling, grammar_mask_workers=mask_workers)
    yield llm
    llm.engine.close()


@pytest.fixture(scope="module")
def grammar(llm) -> Grammar:
    return compile_grammar("regex", REGEX, llm.get_tokenizer())


@pytest.mark.parametrize("fault", list(STAGES))
def test_a_request_that_raises_fails_alone(llm, grammar, fault, monkeypatch):
    healthy = {"plain": Request([5, 6, 7, 8], greedy(16)),
               "guided": Request([12, 13, 14], SamplingParams(max_tokens=16, temperature=0.0), grammar)}
    alone = {name: run(llm.engine, {name: r})[name] for name, r in healthy.items()}
    outs = run(llm.engine, {**healthy, "faulty": faulty_request(fault, grammar, monkeypatch)})
    assert_failed(outs["faulty"], STAGES[fault])  # a matcher opens here first (its start's forced text), pooled or not
    for name in healthy:
        assert outs[name].error is None
        assert outs[name].outputs[0].token_ids == alone[name].outputs[0].token_ids
    assert outs["plain"].outputs[0].finish_reason == "length"
    assert outs["guided"].outputs[0].finish_reason == "stop"
    assert_no_leaks(llm)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async_scheduling"])
def test_a_failed_forward_fails_its_step_and_the_engine_goes_on(tiny_llama_dir, monkeypatch, async_scheduling):
    # Two sequences at a time: "waiting" is queued, outside the step that fails.
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22, block_size=4, max_num_seqs=2,
              async_scheduling=async_scheduling)
    engine = llm.engine
    requests = {"a": Request([5, 6, 7], greedy(12)), "b": Request([8, 9], greedy(12)),
                "waiting": Request([10, 11, 12], greedy(12))}
    alone = run(engine, {"waiting": requests["waiting"]})["waiting"]
    monkeypatch.setattr(engine.runner, "execute", failing_on_call(3, engine.runner.execute))
    outs = run(engine, requests)
    for name in ("a", "b"):
        assert_failed(outs[name], "the engine step failed")
    assert outs["waiting"].error is None
    assert outs["waiting"].outputs[0].token_ids == alone.outputs[0].token_ids
    assert_no_leaks(llm)
    after = run(engine, {"after": Request([5, 6, 7], greedy(12))})["after"]
    assert after.error is None and len(after.outputs[0].token_ids) == 12


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async_scheduling"])
def test_a_failed_sampler_keeps_the_outputs_taken_before_it(tiny_llama_dir, monkeypatch, async_scheduling):
    # "short" takes in its last token in the step whose sampler fails (with async scheduling, in
    # that very step, before the sampler runs): it finishes normally, "long" fails.
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22, block_size=4,
              async_scheduling=async_scheduling)
    engine = llm.engine
    monkeypatch.setattr(engine, "sampler", failing_on_call(3, engine.sampler))
    outs = run(engine, {"short": Request([5, 6, 7], greedy(2)), "long": Request([8, 9], greedy(12))})
    assert outs["short"].error is None and len(outs["short"].outputs[0].token_ids) == 2
    assert_failed(outs["long"], "the engine step failed")
    assert_no_leaks(llm)


# ---- through AsyncLLM --------------------------------------------------------------------------
@dataclass
class AsyncRun:
    outputs: list[RequestOutput] = field(default_factory=list)
    error: BaseException | None = None


async def consume(llm: AsyncLLM, request_id: str, request: Request) -> AsyncRun:
    result = AsyncRun()
    try:
        stream = await llm.add_request(request_id, request.prompt, request.params, grammar=request.grammar)
        async for out in stream:
            result.outputs.append(out)
    except (RequestFailed, EngineDeadError) as e:
        result.error = e
    return result


@pytest.fixture(scope="module")
def async_llm(tiny_llama_dir):
    llm = AsyncLLM(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=4_000_000))
    yield llm
    llm.shutdown()


def test_the_caller_of_a_failing_request_gets_request_failed(async_llm):
    grammar = compile_grammar("regex", REGEX, async_llm.tokenizer)
    faulty = Request([9, 10, 11], greedy(16), FaultyGrammar(grammar, "accept_token"))

    async def both():
        return await asyncio.gather(consume(async_llm, "good", Request([5, 6, 7], greedy(12))),
                                    consume(async_llm, "faulty", faulty))

    good, failed = asyncio.run(asyncio.wait_for(both(), timeout=60))
    assert isinstance(failed.error, RequestFailed) and STAGES["accept_token"] in str(failed.error)
    assert good.error is None and len(good.outputs[-1].outputs[0].token_ids) == 12
    wait_until(lambda: async_llm.stats.num_used_blocks == 0, 5, "blocks freed")
    assert async_llm.num_active_requests == 0 and not async_llm.engine.requests


def test_shutdown_fails_requests_in_flight_and_refuses_new_ones(tiny_llama_dir):
    llm = AsyncLLM(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=4_000_000,
                                grammar_cache_dir=None))
    guided = StructuredOutputsParams(regex=REGEX)

    async def shut_down_mid_request() -> tuple[list[int], BaseException | None]:
        await llm.compile(guided)  # in the compile worker (no disk cache to hit)
        workers = llm.engine.guided.service.worker_pids()
        stream = await llm.add_request("long", [5, 6, 7], greedy(120))
        await anext(stream)
        await asyncio.to_thread(llm.shutdown)
        try:
            async for _ in stream:
                pass
        except EngineDeadError as e:
            return workers, e
        return workers, None

    workers, error = asyncio.run(asyncio.wait_for(shut_down_mid_request(), timeout=60))
    assert isinstance(error, EngineDeadError) and "shut down" in str(error)
    assert workers
    wait_until(lambda: not any(is_running(pid) for pid in workers), 5, f"compile workers {workers} stopped")

    async def after_shutdown() -> None:
        with pytest.raises(EngineDeadError):
            await llm.add_request("late", [5, 6], greedy(4))
        with pytest.raises(EngineDeadError):
            await llm.compile(guided)

    asyncio.run(asyncio.wait_for(after_shutdown(), timeout=10))
    assert llm.num_active_requests == 0
