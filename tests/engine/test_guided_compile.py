"""Guided requests whose grammar compiles in the background: they hold no other request, and the
compile workers work from a plain script without the `if __name__ == "__main__":` guard."""
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from gdserve import LLM, SamplingParams
from gdserve.sampling_params import StructuredOutputsParams
from tests.engine.test_llm import assert_no_leaks

READY = r"[0-9]{2,4}"       # compiled before the others are sent
SLOW = r"[a-z]{3,6}!"        # sent to a frozen worker: compiling for as long as the test needs


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def run_until(engine, request_ids: set[str]) -> dict:
    finished = {}
    while not request_ids <= finished.keys():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return finished


@pytest.fixture
def llm(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=4_000_000, grammar_cache_dir=None,
              grammar_compile_workers=1, grammar_compile_timeout_s=120)
    yield llm
    llm.engine.close()


def test_a_compiling_request_delays_no_other_request(llm):
    """The only compile worker is stopped (SIGSTOP) before a guided request is sent, so its
    compile cannot finish: unguided requests and guided ones whose grammar is already compiled,
    sent after it, all run to their last token while it is still compiling; it then completes."""
    engine = llm.engine
    engine.guided.submit(StructuredOutputsParams(regex=READY)).result()
    (worker,) = engine.guided.service.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    try:
        slow = engine.add_request([5, 6, 7], greedy(12, structured_outputs=StructuredOutputsParams(regex=SLOW)))
        unguided = {engine.add_request([9, 10, 11 + i], greedy(16, ignore_eos=True)) for i in range(2)}
        guided = {engine.add_request([12, 13, 14 + i], greedy(8, structured_outputs=StructuredOutputsParams(regex=READY)))
                  for i in range(2)}
        finished = run_until(engine, unguided | guided)
        assert slow not in finished and engine.stats().num_waiting == 1  # still compiling
    finally:
        os.kill(worker, signal.SIGCONT)
    for request_id in unguided:
        assert len(finished[request_id].outputs[0].token_ids) == 16
    for request_id in guided:
        completion = finished[request_id].outputs[0]
        assert completion.finish_reason == "stop" and re.fullmatch(READY, completion.text), completion
    completion = run_until(engine, {slow})[slow].outputs[0]
    assert completion.finish_reason == "stop" and re.fullmatch(SLOW, completion.text), completion
    assert_no_leaks(llm)


def test_the_forward_leaves_a_core_to_a_busy_compile_worker(llm):
    """On the CPU, while a compile worker is busy the forward runs on one thread fewer (a torch
    thread whose core the worker holds would stall every step); all of them again once it is
    done, and the engine's close leaves torch as it found it."""
    engine, threads = llm.engine, torch.get_num_threads()
    engine.guided.submit(StructuredOutputsParams(regex=READY)).result()
    (worker,) = engine.guided.service.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    try:
        slow = engine.add_request([5, 6, 7], greedy(12, structured_outputs=StructuredOutputsParams(regex=SLOW)))
        unguided = engine.add_request([9, 10, 11], greedy(4, ignore_eos=True))
        engine.step()
        assert torch.get_num_threads() == max(1, threads - 1)
        run_until(engine, {unguided})
    finally:
        os.kill(worker, signal.SIGCONT)
    run_until(engine, {slow})
    engine.add_request([9, 10, 11], greedy(2, ignore_eos=True))
    engine.step()
    assert torch.get_num_threads() == threads
    torch.set_num_threads(max(1, threads - 1))
    engine.close()
    assert torch.get_num_threads() == threads


def test_a_plain_script_without_a_main_guard_generates_guided(tiny_llama_dir, tmp_path):
    """The compile workers never import the script (its body runs once) nor load its model."""
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        from gdserve import LLM, SamplingParams
        from gdserve.sampling_params import StructuredOutputsParams

        print("script body ran", flush=True)
        llm = LLM({str(tiny_llama_dir)!r}, dtype="float32", kv_cache_memory=4_000_000, grammar_cache_dir=None)
        params = SamplingParams(max_tokens=16, temperature=0.0, structured_outputs=StructuredOutputsParams(regex={SLOW!r}))
        out = llm.generate({{"prompt_token_ids": [5, 6, 7]}}, params)
        print("OUTPUT", out[0].outputs[0].text, flush=True)
    """))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("script body ran") == 1, proc.stdout
    (output,) = [line.removeprefix("OUTPUT ") for line in proc.stdout.splitlines() if line.startswith("OUTPUT")]
    assert re.fullmatch(SLOW, output), output
