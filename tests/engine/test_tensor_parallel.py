"""Tensor parallelism through the offline LLM: float32 greedy tokens with the model split across
ranks equal the single-device engine's (with prefix caching, swap preemption and guided requests
in the batch), and a rank that dies fails the engine within seconds with an error naming it."""
import json
import os
import signal
import threading
import time

import pytest
import torch
from transformers import LlamaConfig

from gdserve import LLM, SamplingParams
from gdserve.engine.errors import EngineDeadError
from gdserve.sampling_params import StructuredOutputsParams
from tests.distributed.ranks import DEVICES
from tests.engine.test_llm import assert_no_leaks, greedy
from tests.helpers import TINY_LLAMA, chat_ids, save_byte_tokenizer, save_random_hf_model

REGEX = "[a-z]{4,12}"


@pytest.fixture(scope="module", params=[2, 1], ids=["kv-heads-sharded", "kv-heads-replicated"])
def tiny_gqa_dir(request, tmp_path_factory):
    """The tiny Llama (4 heads) with 2 KV heads (one per rank) or 1 (replicated on both)."""
    path = tmp_path_factory.mktemp(f"tiny-llama-kv{request.param}")
    config = LlamaConfig(**{**TINY_LLAMA, "num_key_value_heads": request.param}, architectures=["LlamaForCausalLM"])
    save_random_hf_model(config, path)
    save_byte_tokenizer(path)
    return path


def prompts() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(3, 250, (12,), generator=g).tolist()  # a common prefix: prefix-cache hits
    return [{"prompt_token_ids": (shared if i % 2 else []) + torch.randint(3, 250, (int(n),), generator=g).tolist()}
            for i, n in enumerate(torch.randint(1, 30, (10,), generator=g))]


def generate(model_dir, tensor_parallel_size: int, device: str, requests, params, **engine) -> list[list[int]]:
    """Tokens from a cache small enough to preempt (by swapping) and a guided request among them."""
    with LLM(str(model_dir), dtype="float32", device=device, tensor_parallel_size=tensor_parallel_size,
             max_num_batched_tokens=64, block_size=4, max_model_len=64, num_gpu_blocks_override=24,
             preemption_mode="swap", swap_space=0.01, schedule_conservativeness=0,
             grammar_compile_workers=1, **engine) as llm:
        outs = llm.generate(requests, params, use_tqdm=False)
        assert_no_leaks(llm)
        if tensor_parallel_size > 1:
            assert llm.engine.scheduler.num_swap_outs > 0 and llm.engine.kv_cache.num_hits > 0
        return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("device", DEVICES)
def test_two_ranks_give_the_single_device_greedy_tokens(tiny_gqa_dir, device):
    requests = prompts()
    params = [greedy(24)] * (len(requests) - 1) + [SamplingParams(max_tokens=16, temperature=0.0,
                                                                  structured_outputs=StructuredOutputsParams(regex=REGEX))]
    expected = generate(tiny_gqa_dir, 1, device, requests, params)
    tokens = generate(tiny_gqa_dir, 2, device, requests, params)
    assert tokens == expected


def test_every_rank_takes_fp8_attention(tiny_gqa_dir):
    """fp8_attention turns each rank's heads and rounds them as one device does: the same tokens."""
    requests, params = prompts()[:6], greedy(16)
    fp8 = dict(kv_cache_dtype="fp8", fp8_attention=True)
    assert generate(tiny_gqa_dir, 2, "cpu", requests, params, **fp8) == \
        generate(tiny_gqa_dir, 1, "cpu", requests, params, **fp8)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    torch.cuda.device_count() < 3, reason="needs 3 CUDA devices"))])
def test_the_default_model_split_in_three_gives_the_single_device_tokens(smollm2_dir, device):
    """SmolLM2-135M has 9 heads and 3 KV heads: 3 ranks split it (2 cannot, and are refused)."""
    def run(size: int) -> list[list[int]]:
        with LLM(str(smollm2_dir), dtype="float32", device=device, tensor_parallel_size=size,
                 kv_cache_memory=1 << 26, grammar_compile_workers=1) as llm:
            requests = [chat_ids(llm, text) for text in ("Name a color.", "What is 2 + 2?")]
            guided = SamplingParams(max_tokens=24, temperature=0.0,
                                    structured_outputs=StructuredOutputsParams(json={"type": "object", "required": ["a"],
                                                                      "properties": {"a": {"type": "integer"}}}))
            outs = llm.generate(requests + requests[:1], [greedy(16), greedy(16), guided], use_tqdm=False)
            assert isinstance(json.loads(outs[2].outputs[0].text)["a"], int)
            return [o.outputs[0].token_ids for o in outs]

    assert run(3) == run(1)


def test_a_killed_rank_fails_the_engine_within_seconds(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", tensor_parallel_size=2, kv_cache_memory=1 << 22,
              grammar_compile_workers=1)
    worker = llm.engine.executor.workers[0].process
    killed_at = []

    def kill() -> None:
        time.sleep(0.5)
        killed_at.append(time.monotonic())
        os.kill(worker.pid, signal.SIGKILL)

    threading.Thread(target=kill).start()
    with pytest.raises(EngineDeadError, match=rf"rank 1 \(pid {worker.pid}\) exited with signal SIGKILL"):
        while True:
            llm.generate([{"prompt_token_ids": [5, 6, 7]}] * 4, greedy(64), use_tqdm=False)
    assert time.monotonic() - killed_at[0] < 10
    with pytest.raises(EngineDeadError, match="rank 1"):  # and stays dead
        llm.generate([{"prompt_token_ids": [5]}], greedy(2), use_tqdm=False)
    llm.close()
    assert worker.poll() is not None


def test_close_stops_the_ranks_and_a_new_engine_starts(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", tensor_parallel_size=2, kv_cache_memory=1 << 22,
              grammar_compile_workers=1)
    workers = [w.process for w in llm.engine.executor.workers]
    llm.close()
    llm.close()
    assert all(p.poll() is not None for p in workers)
    with LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22, grammar_compile_workers=1) as single:
        assert single.engine.model.model.layers[0].self_attn.num_heads == TINY_LLAMA["num_attention_heads"]


def test_a_model_that_does_not_split_is_refused_naming_its_sizes(tiny_llama_dir):
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 does not divide the model's 4 attention heads"):
        LLM(str(tiny_llama_dir), dtype="float32", tensor_parallel_size=3, grammar_compile_workers=1)
