"""Faults through the HTTP server, on a tiny random-weight model with a 4096-token context (its
streams run long enough to be caught in flight): a client that hangs up mid-stream, a grammar
compile worker killed mid-compile or while idle, SIGTERM with requests in flight. (A request that
fails inside an engine step is tested at the engine level: tests/engine/test_faults.py.)"""
import asyncio
import os
import re
import signal
import socket
import subprocess
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from transformers import LlamaConfig

from tests.entrypoints.openai.conftest import Server, start_server, stop_server
from tests.entrypoints.openai.observe import (StreamResult, completion_body, compile_workers, cpu_seconds, exists,
                                              is_running, stream_completion, wait_until)
from tests.helpers import SLOW_SCHEMA, TINY_LLAMA, save_byte_tokenizer, save_random_hf_model

CONTEXT = 4096
SERVER_ARGS = ("--max-model-len", str(CONTEXT), "--kv-cache-memory", str(32 << 20), "--grammar-cache-dir", "none",
               "--grammar-compile-timeout-s", "120")
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def long_tiny_dir(tmp_path_factory) -> Path:
    """The tiny test Llama and byte tokenizer, with room for CONTEXT positions."""
    path = tmp_path_factory.mktemp("tiny-llama-long")
    config = LlamaConfig(**{**TINY_LLAMA, "max_position_embeddings": CONTEXT}, architectures=["LlamaForCausalLM"])
    save_random_hf_model(config, path)
    save_byte_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def fault_server(long_tiny_dir, tmp_path_factory):
    proc, server = start_server(long_tiny_dir, tmp_path_factory.mktemp("logs") / "faults.log", *SERVER_ARGS)
    yield proc, server
    stop_server(proc)


def guided_completion(regex: str | None = None, **constraint) -> dict:
    return {"model": "test-model", "prompt": "Answer:", "max_tokens": 16, "temperature": 0,
            **({"guided_regex": regex} if regex is not None else constraint)}


def assert_guided_works(server: Server, regex: str) -> None:
    status, body = server.post("/v1/completions", guided_completion(regex))
    assert status == 200, body
    assert re.fullmatch(regex, body["choices"][0]["text"]), body


def setting(event: asyncio.Event) -> Callable[[StreamResult], Awaitable[bool]]:
    """An on_chunk that sets event (the stream is under way) and reads on."""
    async def on_chunk(_: StreamResult) -> bool:
        event.set()
        return True
    return on_chunk


# ---- a client that hangs up ----------------------------------------------------------------------
def test_a_client_that_hangs_up_mid_stream_frees_its_blocks_at_once(fault_server):
    _, server = fault_server
    prompt = "x" * 1500  # 1500 byte tokens: more blocks than the other two streams ever hold together
    prompt_blocks = len(prompt) // BLOCK_SIZE
    others_max_tokens = 200
    assert 2 * -(-(others_max_tokens + 16) // BLOCK_SIZE) < prompt_blocks

    async def scenario() -> tuple[float, float, list[StreamResult]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            streaming = [asyncio.Event(), asyncio.Event()]
            others = [asyncio.create_task(stream_completion(client, completion_body(f"Other {i}:", others_max_tokens),
                                                            setting(event))) for i, event in enumerate(streaming)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), 60)
            held = []

            async def hang_up_after_three(result: StreamResult) -> bool:
                if len(result.texts) < 3:
                    return True
                held.append(await asyncio.to_thread(server.metric, "gdserve_kv_cache_used_blocks"))
                return False

            await stream_completion(client, completion_body(prompt, CONTEXT - len(prompt) - 1), hang_up_after_three)
            await asyncio.to_thread(wait_until, lambda: server.metric("gdserve_kv_cache_used_blocks") < prompt_blocks,
                                    2.0, "the hung-up request's blocks freed")
            running = await asyncio.to_thread(server.metric, "gdserve_num_requests_running")
            return held[0], running, await asyncio.wait_for(asyncio.gather(*others), 120)

    held, running, others = asyncio.run(asyncio.wait_for(scenario(), 240))
    assert held >= prompt_blocks and running <= 2
    for result in others:
        assert result.completed and result.num_tokens == others_max_tokens, result
    wait_until(lambda: server.metric("gdserve_kv_cache_used_blocks") == 0
               and server.metric("gdserve_num_requests_running") == 0, 5, "every block free, nothing running")


# ---- grammar compile workers ---------------------------------------------------------------------
def test_a_worker_killed_mid_compile_fails_that_request_and_the_pool_recovers(fault_server):
    proc, server = fault_server
    assert_guided_works(server, "[a-z]{3}")  # the worker is up
    (worker,) = compile_workers(proc.pid)
    idle_cpu = cpu_seconds(worker)
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(server.post, "/v1/completions", guided_completion(guided_json=SLOW_SCHEMA))
        wait_until(lambda: cpu_seconds(worker) > idle_cpu + 0.3, 30, "the slow compile running")
        os.kill(worker, signal.SIGKILL)
        status, body = slow.result(timeout=30)
    assert status == 503, body
    assert body["error"]["code"] == "grammar_compiler_unavailable", body
    assert "grammar compile worker died" in body["error"]["message"], body
    assert_guided_works(server, "[0-9]{3}")  # on a fresh worker
    assert worker not in compile_workers(proc.pid)


def test_a_worker_killed_while_idle_is_replaced_for_the_next_request(fault_server):
    proc, server = fault_server
    assert_guided_works(server, "[a-z]{4}")
    (worker,) = compile_workers(proc.pid)
    os.kill(worker, signal.SIGKILL)
    # Gone from /proc once its pool has reaped it, which it does after marking itself broken: the
    # next compile then starts a fresh worker rather than failing on the dead one.
    wait_until(lambda: not exists(worker), 10, "the killed worker reaped")
    assert_guided_works(server, "[a-z]{5}")


# ---- SIGTERM --------------------------------------------------------------------------------------
LONG_TOKENS = CONTEXT - 64   # thousands of steps: still running when the grace period ends
SHORT_TOKENS = 10            # done well within it


async def _requests_across_sigterm(proc: subprocess.Popen, server: Server):
    """Long and short streams and a long non-streamed request in flight, then SIGTERM: returns
    their results and whether new connections were refused while the server still drained."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        bodies = [completion_body("Long:", LONG_TOKENS)] * 2 + [completion_body("Short:", SHORT_TOKENS)] * 2
        first_chunks = [asyncio.Event() for _ in bodies]
        streams = [asyncio.create_task(stream_completion(client, body, setting(event)))
                   for body, event in zip(bodies, first_chunks)]
        unstreamed = asyncio.create_task(client.post("/v1/completions", json={
            "model": "test-model", "prompt": "Long:", "max_tokens": LONG_TOKENS, "ignore_eos": True}))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_chunks)), 60)
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_until, lambda: _refuses_connections(server), 5, "new connections refused")
        draining = proc.poll() is None
        return await asyncio.gather(*streams), await unstreamed, draining


def _refuses_connections(server: Server) -> bool:
    host, port = server.url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_answers_every_request_in_flight_then_exits(long_tiny_dir, tmp_path):
    log = tmp_path / "sigterm.log"
    proc, server = start_server(long_tiny_dir, log, *SERVER_ARGS)
    try:
        assert_guided_works(server, "[a-z]{3}")
        workers = compile_workers(proc.pid)
        streams, unstreamed, refused_while_draining = asyncio.run(
            asyncio.wait_for(_requests_across_sigterm(proc, server), 60))
        returncode = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert refused_while_draining
    long, short = streams[:2], streams[2:]
    for result in short:
        assert result.completed and result.num_tokens == SHORT_TOKENS, result
    for result in long:  # failed when the grace period ended, in-band, and the stream closed properly
        assert result.done and "shut down" in result.error["message"], result
    assert unstreamed.status_code == 503 and unstreamed.json()["error"]["code"] == "engine_unavailable"
    assert returncode == -signal.SIGTERM  # uvicorn re-raises the signal once it has shut down
    assert workers
    wait_until(lambda: not any(is_running(pid) for pid in workers), 10, f"compile workers {workers} stopped")
    assert "timeout graceful shutdown exceeded" not in log.read_text()  # nothing was left for uvicorn to cut
