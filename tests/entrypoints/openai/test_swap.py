"""`gdserve serve --preemption-mode swap`: concurrent requests that outgrow a small KV cache are
swapped out and back, answer as they do alone, and leave nothing in the swap space."""
import asyncio

import pytest

from tests.entrypoints.openai.conftest import start_server, stop_server


@pytest.fixture(scope="module")
def swap_server(tiny_llama_dir, tmp_path_factory):
    proc, server = start_server(tiny_llama_dir, tmp_path_factory.mktemp("logs") / "swap.log",
                                "--preemption-mode", "swap", "--swap-space", "0.01", "--block-size", "4",
                                "--num-gpu-blocks-override", "24", "--max-model-len", "128",
                                "--schedule-conservativeness", "0")
    yield server
    stop_server(proc)


def test_concurrent_requests_swap_and_answer_as_they_do_alone(swap_server):
    prompts = [f"Request {i}: " + "abc" * (i % 5) for i in range(10)]
    body = dict(model="test-model", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    client = swap_server.client()
    alone = [client.completions.create(prompt=p, **body).choices[0].text for p in prompts]
    assert swap_server.metric("gdserve_num_preemptions") == 0

    async def together() -> list[str]:
        async_client = swap_server.async_client()
        outs = await asyncio.gather(*(async_client.completions.create(prompt=p, **body) for p in prompts))
        return [o.choices[0].text for o in outs]

    assert asyncio.run(together()) == alone
    assert swap_server.metric("gdserve_num_preemptions") > 0
    assert swap_server.metric("gdserve_num_requests_swapped") == 0
    assert swap_server.metric("gdserve_cpu_cache_usage_perc") == 0
    assert swap_server.metric("gdserve_kv_cache_used_blocks") == 0


def test_swap_without_swap_space_is_refused_at_startup(tiny_llama_dir, tmp_path):
    with pytest.raises(RuntimeError, match="swap_space must be > 0 GiB with preemption_mode 'swap'"):
        start_server(tiny_llama_dir, tmp_path / "bad.log", "--preemption-mode", "swap", "--swap-space", "0")
