"""Load: 256 concurrent streaming clients against the tiny model on CPU, over loopback. Every request
completes (its stream ends with [DONE], finish_reason set, max_tokens tokens) or, when the queue is
full, is refused with a 429 and an OpenAI error body; nothing else (no 5xx, no hang, no cut
connection). Afterwards the engine holds no blocks and no requests, and the server's memory is back
within 10% of its level before the load (measured after a warm-up round, which takes the server
through its first requests, allocations that stay)."""
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from tests.entrypoints.openai.conftest import Server, start_server, stop_server
from tests.entrypoints.openai.observe import StreamResult, completion_body, rss_kib, stream_completion, wait_until

NUM_CLIENTS = 256
WARM_UP_CLIENTS = 32  # a full-size warm-up leaves RSS flat across the measured round, at twice the time
MAX_TOKENS = 8
QUEUES = {"bounded": 128, "roomy": NUM_CLIENTS}  # --max-queue of each server
ROUND_TIMEOUT_S = 60


@dataclass
class Round:
    results: list[StreamResult]
    wall_s: float

    @property
    def completed(self) -> int:
        return sum(r.completed for r in self.results)

    @property
    def rejected(self) -> int:
        return sum(r.status == 429 for r in self.results)


@pytest.fixture(scope="module")
def servers(tiny_llama_dir, tmp_path_factory):
    """One server per queue size, started side by side."""
    logs = tmp_path_factory.mktemp("load-logs")

    def start(name: str):
        return start_server(tiny_llama_dir, logs / f"{name}.log", "--max-queue", str(QUEUES[name]),
                            "--kv-cache-memory", "8000000")

    with ThreadPoolExecutor(len(QUEUES)) as pool:
        started = dict(zip(QUEUES, pool.map(start, QUEUES)))
    yield started
    for proc, _ in started.values():
        stop_server(proc)


async def _load(server: Server, num_clients: int) -> Round:
    limits = httpx.Limits(max_connections=NUM_CLIENTS, max_keepalive_connections=NUM_CLIENTS)
    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=ROUND_TIMEOUT_S) as client:
        start = time.monotonic()
        results = await asyncio.gather(*(stream_completion(client, completion_body(f"Request {i}:", MAX_TOKENS))
                                         for i in range(num_clients)))
    return Round(list(results), time.monotonic() - start)


def load_round(server: Server, num_clients: int) -> Round:
    """num_clients streams at once; a connection error or a hang fails the test."""
    return asyncio.run(asyncio.wait_for(_load(server, num_clients), ROUND_TIMEOUT_S + 10))


def assert_completed_or_refused(result: StreamResult) -> None:
    if result.status == 429:
        assert result.error["type"] == "rate_limit_error" and result.error["code"] == "queue_full", result
        return
    assert result.completed, result
    assert result.finish_reason == "length" and result.num_tokens == MAX_TOKENS, result


def wait_idle(server: Server) -> None:
    idle = ("gdserve_kv_cache_used_blocks", "gdserve_num_requests_running", "gdserve_num_requests_waiting")
    wait_until(lambda: all(server.metric(name) == 0 for name in idle), 10, f"{idle} all 0", interval_s=0.1)


@pytest.mark.parametrize("queue", list(QUEUES))
def test_256_streaming_clients(servers, queue):
    proc, server = servers[queue]
    warm_up = load_round(server, WARM_UP_CLIENTS)
    wait_idle(server)
    rss_before = rss_kib(proc.pid)
    measured = load_round(server, NUM_CLIENTS)
    wait_idle(server)
    rss_after = rss_kib(proc.pid)
    print(f"\n{queue} (--max-queue {QUEUES[queue]}), {NUM_CLIENTS} streaming clients x {MAX_TOKENS} tokens: "
          f"{measured.completed} completed, {measured.rejected} rejected (429) in {measured.wall_s:.1f} s; "
          f"server RSS {rss_before / 1024:.0f} -> {rss_after / 1024:.0f} MiB "
          f"(after a warm-up of {WARM_UP_CLIENTS} clients in {warm_up.wall_s:.1f} s)")
    for result in warm_up.results + measured.results:
        assert_completed_or_refused(result)
    if QUEUES[queue] >= NUM_CLIENTS:
        assert measured.completed == NUM_CLIENTS
    else:
        assert measured.rejected > 0
    assert rss_after <= 1.10 * rss_before
