"""AsyncLLM: the engine stepped by a background thread, driven from asyncio."""
import asyncio

import pytest
import torch
from transformers import AutoModel

from gdserve.config import EngineConfig
from gdserve.engine.async_llm import AsyncLLM, RequestFailed
from gdserve.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    llm = AsyncLLM(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=4_000_000))
    yield llm
    llm.shutdown()


async def _final(llm: AsyncLLM, request_id: str, prompt: list[int], params: SamplingParams):
    outs = [out async for out in llm.generate(request_id, prompt, params)]
    assert outs[-1].finished and all(not o.finished for o in outs[:-1])
    return outs[-1]


def test_concurrent_requests_all_finish(llm):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    async def run():
        return await asyncio.gather(*(_final(llm, f"r{i}", [5 + i, 6, 7], params) for i in range(6)))

    outs = asyncio.run(run())
    assert [len(o.outputs[0].token_ids) for o in outs] == [12] * 6
    assert llm.num_active_requests == 0 and llm.engine.stats().num_used_blocks == 0


def test_bad_request_raises_and_spares_the_others(llm):
    async def run():
        good = asyncio.ensure_future(_final(llm, "good", [5, 6], SamplingParams(max_tokens=8, ignore_eos=True)))
        with pytest.raises(ValueError, match="vocabulary"):
            await llm.add_request("bad", [10_000], SamplingParams())
        return await good

    assert len(asyncio.run(run()).outputs[0].token_ids) == 8


def test_closing_the_stream_aborts_and_frees_blocks(llm):
    async def run():
        stream = await llm.add_request("long", [5, 6, 7], SamplingParams(max_tokens=100, ignore_eos=True))
        await anext(stream)
        await stream.aclose()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if llm.stats.num_used_blocks == 0 and not llm.engine.requests:
                return True
        return False

    assert asyncio.run(run())
    assert llm.num_active_requests == 0


def test_a_failed_step_fails_its_requests_and_the_loop_goes_on(llm, monkeypatch):
    real_step = llm.engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real_step()

    monkeypatch.setattr(llm.engine, "step", flaky_step)

    async def run():
        with pytest.raises(RequestFailed, match="the engine step failed \\(RuntimeError\\)"):
            await _final(llm, "doomed", [5, 6], SamplingParams(max_tokens=20, ignore_eos=True))
        return await _final(llm, "after", [5, 6], SamplingParams(max_tokens=3, ignore_eos=True))

    assert len(asyncio.run(run()).outputs[0].token_ids) == 3
    assert llm.engine.stats().num_used_blocks == 0


def test_embeddings_are_hf_mean_pooled_hidden_states(llm, tiny_llama_dir):
    ids = [5, 6, 7, 8, 9]
    vec = torch.tensor(asyncio.run(llm.embed(ids)))
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(tiny_llama_dir)(torch.tensor([ids])).last_hidden_state[0]
    torch.testing.assert_close(vec, torch.nn.functional.normalize(hidden.mean(0), dim=0), atol=1e-5, rtol=1e-4)
    assert abs(vec.norm().item() - 1) < 1e-5
    assert llm.engine.stats().num_used_blocks == 0


def test_a_load_error_is_raised_by_the_constructor(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        AsyncLLM(EngineConfig(model=str(tmp_path / "missing")))
