"""Swap preemption end to end on the CPU: a KV cache too small for the batch, preempted sequences
swapped to CPU memory and back, against recompute and an unpreempted run."""
import pytest
import torch
from transformers import AutoConfig

from gdserve import LLM, SamplingParams
from gdserve.engine import model_runner
from gdserve.engine.model_runner import kv_cache_bytes_per_block
from gdserve.models.config import ModelConfig
from tests.engine.test_llm import assert_no_leaks, greedy


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 250, (int(n),), generator=g).tolist() for n in torch.randint(4, 40, (12,), generator=g)]


def block_bytes(model_dir, dtype=torch.float32) -> int:
    return kv_cache_bytes_per_block(ModelConfig.from_hf(AutoConfig.from_pretrained(model_dir)), 4, dtype)


def tight_llm(model_dir, mode: str, num_blocks: int = 16, swap_blocks: int = 64, **kw) -> LLM:
    """num_blocks KV blocks of 4 tokens and no growth reserve: the batch outgrows them and preempts."""
    kv_dtype = {"fp8": torch.float8_e4m3fn}.get(kw.get("kv_cache_dtype"), torch.float32)
    per_block = block_bytes(model_dir, kv_dtype)
    return LLM(str(model_dir), dtype="float32", max_num_batched_tokens=64, block_size=4, max_model_len=64,
               kv_cache_memory=num_blocks * per_block, preemption_mode=mode, schedule_conservativeness=0,
               swap_space=swap_blocks * per_block / (1 << 30), **kw)


def assert_swap_space_free(llm: LLM) -> None:
    swap = llm.engine.kv_cache.swap_space
    assert swap.num_free_blocks == swap.num_blocks and not llm.engine.scheduler.swapped


def token_ids(outs) -> list[list[int]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def test_swap_and_recompute_give_the_unpreempted_greedy_tokens(tiny_llama_dir, prompts):
    requests = [{"prompt_token_ids": ids} for ids in prompts]
    roomy = LLM(str(tiny_llama_dir), dtype="float32", max_num_batched_tokens=64, block_size=4, max_model_len=64)
    expected = token_ids(roomy.generate(requests, greedy(24)))
    assert roomy.engine.scheduler.num_preemptions == 0
    for mode in ("swap", "recompute"):
        llm = tight_llm(tiny_llama_dir, mode)
        assert token_ids(llm.generate(requests, greedy(24))) == expected, mode
        scheduler = llm.engine.scheduler
        assert scheduler.num_preemptions > 0
        assert (scheduler.num_swap_outs > 0) == (mode == "swap")
        assert_no_leaks(llm)
        assert_swap_space_free(llm)


def test_a_small_swap_space_falls_back_to_recompute_for_what_does_not_fit(tiny_llama_dir, prompts):
    requests = [{"prompt_token_ids": ids} for ids in prompts]
    expected = token_ids(tight_llm(tiny_llama_dir, "recompute").generate(requests, greedy(24)))
    llm = tight_llm(tiny_llama_dir, "swap", swap_blocks=6)
    assert llm.engine.kv_cache.swap_space.num_blocks == 6
    assert token_ids(llm.generate(requests, greedy(24))) == expected
    scheduler = llm.engine.scheduler
    assert 0 < scheduler.num_swap_outs < scheduler.num_preemptions
    assert_no_leaks(llm)
    assert_swap_space_free(llm)


def test_samples_sharing_their_prompt_blocks_swap_correctly(tiny_llama_dir, prompts):
    """n=3 seeded samples share the prompt's blocks (prefix caching): the shared blocks stay on
    the device while each sample's own blocks swap."""
    requests = [{"prompt_token_ids": ids} for ids in prompts[:6]]
    params = SamplingParams(n=3, max_tokens=20, temperature=1.0, seed=7, ignore_eos=True)
    roomy = LLM(str(tiny_llama_dir), dtype="float32", max_num_batched_tokens=64, block_size=4, max_model_len=64)
    expected = token_ids(roomy.generate(requests, params))
    llm = tight_llm(tiny_llama_dir, "swap", num_blocks=20)
    assert token_ids(llm.generate(requests, params)) == expected
    assert llm.engine.scheduler.num_swap_outs > 0
    assert_no_leaks(llm)
    assert_swap_space_free(llm)


def test_an_fp8_kv_cache_swaps_its_bytes_unchanged(tiny_llama_dir, prompts):
    requests = [{"prompt_token_ids": ids} for ids in prompts]
    outs = {}
    for mode in ("swap", "recompute"):
        llm = tight_llm(tiny_llama_dir, mode, kv_cache_dtype="fp8")
        outs[mode] = token_ids(llm.generate(requests, greedy(24)))
        assert llm.engine.scheduler.num_preemptions > 0
        assert_no_leaks(llm)
    assert outs["swap"] == outs["recompute"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(preemption_mode="page-out"), "preemption_mode must be one of"),
    (dict(preemption_mode="swap", swap_space=0), "swap_space must be > 0 GiB with preemption_mode 'swap'"),
    (dict(swap_space=-1), "swap_space must be >= 0"),
])
def test_bad_preemption_settings_are_refused_naming_the_field(tiny_llama_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_llama_dir), dtype="float32", **kwargs)


def test_a_swap_space_larger_than_the_machine_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="swap_space 100000 GiB is more than 70% of this machine"):
        LLM(str(tiny_llama_dir), dtype="float32", preemption_mode="swap", swap_space=100000)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_blocks_swapped_out_and_in_keep_their_bytes(tiny_llama_dir, kv_cache_dtype, monkeypatch):
    """Scattered device blocks to CPU blocks that form several runs (one longer than a copy's
    chunk), back to other device blocks: every byte comes back."""
    monkeypatch.setattr(model_runner, "SWAP_CHUNK_BLOCKS", 3)
    llm = tight_llm(tiny_llama_dir, "swap", num_blocks=40, swap_blocks=20, kv_cache_dtype=kv_cache_dtype)
    runner = llm.engine.runner
    cache = runner.kv_cache.view(torch.uint8)
    cache.copy_(torch.randint(0, 256, cache.shape, dtype=torch.uint8))
    sources, cpu_blocks = [3, 17, 5, 30, 8, 9, 22], [0, 1, 2, 3, 4, 10, 11]
    before = cache[:, :, sources].clone()
    runner.swap_out(list(zip(sources, cpu_blocks)))
    targets = [31, 32, 33, 34, 35, 36, 37]
    runner.swap_in(list(zip(cpu_blocks, targets)))
    assert torch.equal(cache[:, :, targets], before)
