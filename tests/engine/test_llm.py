"""The offline engine against HF transformers `generate` on the same weights, plus batching,
prefix caching, preemption, seeding, stop handling and argument checks."""
import re
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from gdserve import LLM, SamplingParams
from gdserve.engine.model_runner import (dummy_step_blocks, dummy_step_lens, gemm_warm_up_rows,
                                         kv_cache_bytes_per_block)
from gdserve.layers.attention import Attention
from gdserve.layers.quantization import Fp8Linear
from gdserve.models.config import ModelConfig
from gdserve.sampling_params import StructuredOutputsParams
from tests.helpers import fake_quant_fp8_linears, fp8_prefill_attention, rounded_kv_attention

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "List three colors:",
    "1, 2, 3, 4,",
    "The quick brown fox",
    "In machine learning, a transformer is",
    "Q: What is 12 times 12?\nA:",
    "Paris, London, Berlin,",
    "import numpy as np\n",
    "The best way to learn a language is",
    "Water boils at",
    "Dear Sir or Madam, I am writing to",
    "A haiku about autumn:\n",
    "SELECT * FROM",
    "The mitochondria is the powerhouse of",
]


def hf_greedy(model_dir, prompt_ids: list[list[int]], max_new_tokens: int,
              kv_cache_dtype: torch.dtype | None = None, fp8_weights: bool = False,
              attention: str | None = None) -> list[list[int]]:
    """HF's greedy tokens in float32; with kv_cache_dtype, attention sees K and V rounded to it;
    with fp8_weights, its linear layers compute as W8A8 fp8 does; attention: a registered HF
    attention's name instead."""
    attention = attention or ("sdpa" if kv_cache_dtype is None else rounded_kv_attention(kv_cache_dtype))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attention).eval()
    if fp8_weights:
        fake_quant_fp8_linears(model)
    outs = []
    for ids in prompt_ids:
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=None, pad_token_id=0)
        outs.append(out[0, len(ids):].tolist())
    return outs


def assert_no_leaks(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
    assert all(b.ref_cnt == 0 for b in engine.kv_cache.pool.blocks)


def greedy(max_tokens, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def run_staggered(llm: LLM, prompt_ids: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Requests arrive over several steps, joining a batch that is already decoding."""
    engine = llm.engine
    pending = list(enumerate(prompt_ids))
    results: dict[str, list[int]] = {}
    order = []
    step = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(min(step % 3 + 1, len(pending))):
            i, ids = pending.pop(0)
            order.append(engine.add_request(ids, params, request_id=f"s{i}"))
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        step += 1
    return [results[r] for r in order]


# ---- tiny random-weight GQA Llama -------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), dtype="float32", max_num_batched_tokens=64, kv_cache_memory=1 << 22, block_size=4)


@pytest.fixture(scope="module")
def tiny_prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 250, (int(n),), generator=g).tolist() for n in torch.randint(1, 40, (16,), generator=g)]


@pytest.fixture(scope="module")
def tiny_expected(tiny_llama_dir, tiny_prompts):
    return hf_greedy(tiny_llama_dir, tiny_prompts, 24)


def test_tiny_single_prompts_match_hf(tiny_llm, tiny_prompts, tiny_expected):
    for ids, expected in zip(tiny_prompts[:4], tiny_expected[:4]):
        out = tiny_llm.generate({"prompt_token_ids": ids}, greedy(24))[0]
        assert out.outputs[0].token_ids == expected
    assert_no_leaks(tiny_llm)


def test_tiny_staggered_batch_matches_hf(tiny_llm, tiny_prompts, tiny_expected):
    assert run_staggered(tiny_llm, tiny_prompts, greedy(24)) == tiny_expected
    assert_no_leaks(tiny_llm)


def test_warm_up_leaves_outputs_unchanged(tiny_llama_dir, tiny_prompts, tiny_expected):
    rows = gemm_warm_up_rows(8192)
    assert rows[:2048] == list(range(1, 2049)) and rows[-2:] == [8128, 8192] and len(rows) == 2048 + 96
    assert gemm_warm_up_rows(100) == list(range(1, 101))
    assert gemm_warm_up_rows(2100) == [*range(1, 2049), 2100]
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_num_batched_tokens=64, kv_cache_memory=1 << 16,
              block_size=4)
    llm.engine.runner.warm_up(max_num_seqs=8, max_num_tokens=2200, max_model_len=128)  # past the cache: capped
    assert run_staggered(llm, tiny_prompts, greedy(24)) == tiny_expected
    assert_no_leaks(llm)


def test_a_token_budget_past_max_model_len(tiny_llama_dir, tiny_prompts, tiny_expected):
    """A step of 300 tokens over a model of 128 positions holds several sequences: the warm-up's
    (and the GPU's memory profile's) dummy step splits its prefill the same way, never placing a
    token past the model's positions (the rotary tables end there)."""
    assert dummy_step_lens(300, 128) == [1, 128, 128, 43]
    assert dummy_step_lens(1, 128) == [1] and dummy_step_lens(129, 128) == [1, 128]
    assert dummy_step_blocks(300, 128, 16) == 1 + 8 + 8 + 3
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_num_batched_tokens=300, kv_cache_memory=1 << 22,
              block_size=4)
    assert llm.engine.max_model_len == 128
    llm.engine.runner.warm_up(max_num_seqs=16, max_num_tokens=300, max_model_len=128)
    assert llm.engine.runner.dummy_step(300, 128, num_sampled=16).shape[0] == 300  # as the GPU's memory profile runs it
    assert run_staggered(llm, tiny_prompts, greedy(24)) == tiny_expected
    assert_no_leaks(llm)


def stub_cuda_memory(monkeypatch) -> None:
    """torch.cuda's memory calls as a 10**6-byte device whose peak is 1,000 bytes, so the GPU
    start-up's memory profile runs on the CPU."""
    for name, fn in {"synchronize": lambda *a: None, "reset_peak_memory_stats": lambda *a: None,
                     "empty_cache": lambda: None, "max_memory_allocated": lambda *a: 1000,
                     "get_device_properties": lambda *a: SimpleNamespace(total_memory=10 ** 6)}.items():
        monkeypatch.setattr(torch.cuda, name, fn)


def test_cuda_memory_profile_runs_the_largest_step(tiny_llama_dir, monkeypatch):
    """The GPU start-up's KV budget, run here with torch.cuda's memory calls stubbed: the profile
    forwards the whole token budget (split at max_model_len) and samples max_num_seqs rows."""
    from gdserve.engine.model_runner import ModelRunner
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_num_batched_tokens=300, kv_cache_memory=1 << 22,
              block_size=4, max_num_seqs=16)
    steps = []
    dummy_step = ModelRunner.dummy_step

    def recorded(runner, *args, **kwargs):
        steps.append((runner.kv_cache.shape[2], args, kwargs))
        return dummy_step(runner, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "dummy_step", recorded)
    stub_cuda_memory(monkeypatch)
    assert llm.engine._profile_cuda_budget() == int(10 ** 6 * 0.9) - 1000
    assert steps == [(dummy_step_blocks(300, 128, 4), (300, 128), {"num_sampled": 16})]


def test_unset_max_num_seqs_is_sized_from_the_kv_cache(tiny_llama_dir, monkeypatch):
    """The seats follow the cache's capacity, and the GPU's memory profile samples as many rows
    as the default could pick (stubbed as in the test above)."""
    from gdserve.config import default_max_num_seqs
    per_block = kv_cache_bytes_per_block(ModelConfig.from_hf(AutoConfig.from_pretrained(tiny_llama_dir)),
                                         4, torch.float32)
    llm = LLM(str(tiny_llama_dir), dtype="float32", block_size=4, kv_cache_memory=200_000 * per_block,
              max_num_batched_tokens=4096)
    assert llm.engine.config.max_num_seqs == llm.engine.scheduler.max_num_seqs == 781
    assert default_max_num_seqs(800_000, 4096) == 781
    llm.engine.config.max_num_seqs = None
    sampled = []
    monkeypatch.setattr(llm.engine, "_new_runner", lambda num_blocks: SimpleNamespace(
        dummy_step=lambda *args, num_sampled: sampled.append(num_sampled)))
    stub_cuda_memory(monkeypatch)
    llm.engine._profile_cuda_budget()
    assert sampled == [1024]


def test_preemption_keeps_outputs_identical(tiny_llama_dir, tiny_prompts, tiny_expected):
    # 16 blocks of 4 tokens: 16 requests of up to 63 tokens cannot all fit at once.
    per_block = kv_cache_bytes_per_block(ModelConfig.from_hf(AutoConfig.from_pretrained(tiny_llama_dir)),
                                         4, torch.float32)
    small = LLM(str(tiny_llama_dir), dtype="float32", max_num_batched_tokens=64, kv_cache_memory=16 * per_block,
                block_size=4, max_model_len=64, schedule_conservativeness=0)
    assert small.engine.kv_cache.num_blocks == 16
    outs = small.generate([{"prompt_token_ids": ids} for ids in tiny_prompts], greedy(24))
    assert [o.outputs[0].token_ids for o in outs] == tiny_expected
    assert small.engine.scheduler.num_preemptions > 0
    assert_no_leaks(small)


@pytest.mark.parametrize("kv_cache_dtype,torch_dtype", [("fp8", torch.float8_e4m3fn),
                                                         ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_kv_cache_matches_hf_with_rounded_kv(tiny_llama_dir, tiny_prompts, kv_cache_dtype, torch_dtype):
    """An fp8 cache holds 4x the float32 blocks in the same memory, and its greedy tokens are HF's
    with K and V rounded to the same format, through preemptions and a staggered batch."""
    per_block = kv_cache_bytes_per_block(ModelConfig.from_hf(AutoConfig.from_pretrained(tiny_llama_dir)),
                                         4, torch.float32)
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=64,
              kv_cache_memory=4 * per_block, block_size=4, max_model_len=64, schedule_conservativeness=0)
    assert llm.engine.kv_cache.num_blocks == 16
    assert run_staggered(llm, tiny_prompts, greedy(24)) == hf_greedy(tiny_llama_dir, tiny_prompts, 24, torch_dtype)
    assert llm.engine.scheduler.num_preemptions > 0
    assert_no_leaks(llm)


def test_fp8_attention_matches_hf_with_fp8_prompt_attention(tiny_llama_dir, tiny_prompts):
    """fp8_attention=True: each prompt's attention in fp8 math (kernels/fp8_attention.py), the
    decodes exact over the e4m3 cache: HF's greedy tokens when its attention does the same, and
    not the exact math's tokens."""
    prompts = [ids for ids in tiny_prompts if len(ids) > 1]  # a one-token prompt attends as a decode
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="fp8", fp8_attention=True,
              kv_cache_memory=1 << 20, block_size=4, max_model_len=64)
    assert all(m.fp8_math for m in llm.engine.model.modules() if isinstance(m, Attention))
    outs = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": ids} for ids in prompts],
                                                          greedy(24))]
    assert outs == hf_greedy(tiny_llama_dir, prompts, 24, attention=fp8_prefill_attention())
    assert outs != hf_greedy(tiny_llama_dir, prompts, 24, torch.float8_e4m3fn)
    assert_no_leaks(llm)


def test_fp8_weights_match_hf_with_rounded_linears(tiny_llama_dir, tiny_prompts):
    """quantization="fp8" (W8A8) gives HF's greedy tokens when HF's linear layers see their weights
    and inputs rounded the same way, through preemptions and a staggered batch, beside an fp8 cache."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", quantization="fp8", kv_cache_dtype="fp8",
              max_num_batched_tokens=64, kv_cache_memory=1 << 14, block_size=4, max_model_len=64)
    assert all(m.weight.dtype == torch.float8_e4m3fn for m in llm.engine.model.modules() if isinstance(m, Fp8Linear))
    assert sum(isinstance(m, Fp8Linear) for m in llm.engine.model.modules()) == 4 * 2  # qkv, o, gate_up, down
    expected = hf_greedy(tiny_llama_dir, tiny_prompts, 24, torch.float8_e4m3fn, fp8_weights=True)
    assert run_staggered(llm, tiny_prompts, greedy(24)) == expected
    assert expected != hf_greedy(tiny_llama_dir, tiny_prompts, 24, torch.float8_e4m3fn)  # the rounding shows
    assert llm.engine.scheduler.num_preemptions > 0
    assert_no_leaks(llm)


def test_prefix_cache_hit_same_output_fewer_computed_tokens(tiny_llm, tiny_prompts):
    tiny_llm.engine.kv_cache.reset_prefix_cache()
    prefix = tiny_prompts[0] + tiny_prompts[1] + tiny_prompts[2]
    first = tiny_llm.generate({"prompt_token_ids": prefix + [5, 6]}, greedy(8))[0]
    again = tiny_llm.generate({"prompt_token_ids": prefix + [5, 6]}, greedy(8))[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens >= (len(prefix) // 4) * 4 - 4 > 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    no_cache = LLM(str(tiny_llm.engine.config.model), dtype="float32", kv_cache_memory=1 << 22, block_size=4,
                   enable_prefix_caching=False)
    assert no_cache.generate({"prompt_token_ids": prefix + [5, 6]}, greedy(8))[0].outputs[0].token_ids == \
        first.outputs[0].token_ids
    assert_no_leaks(tiny_llm)


def test_n_samples_share_prompt_blocks(tiny_llm, tiny_prompts):
    tiny_llm.engine.kv_cache.reset_prefix_cache()
    prompt = tiny_prompts[3] + tiny_prompts[4] + tiny_prompts[5]
    out = tiny_llm.generate({"prompt_token_ids": prompt}, SamplingParams(n=3, max_tokens=6, seed=1))[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 6 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    engine = tiny_llm.engine
    assert engine.kv_cache.num_hits >= 2 * (len(prompt) - 1) // 4 * 4
    assert_no_leaks(tiny_llm)


def test_seeded_sampling_reproducible_across_batch_compositions(tiny_llm, tiny_prompts):
    seeded = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    alone = tiny_llm.generate({"prompt_token_ids": tiny_prompts[0]}, seeded)[0].outputs[0].token_ids
    others = [SamplingParams(max_tokens=m, temperature=1.0, ignore_eos=True) for m in (3, 20, 7)]
    mixed = tiny_llm.generate([{"prompt_token_ids": p} for p in tiny_prompts[1:4]] +
                              [{"prompt_token_ids": tiny_prompts[0]}], others + [seeded])
    assert mixed[-1].outputs[0].token_ids == alone
    assert_no_leaks(tiny_llm)


def test_logprobs_are_returned_per_token(tiny_llm, tiny_prompts):
    out = tiny_llm.generate({"prompt_token_ids": tiny_prompts[2]}, greedy(5, logprobs=3))[0].outputs[0]
    assert len(out.logprobs) == 5
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert token_id in entry and 3 <= len(entry) <= 4
        assert entry[token_id] == max(entry.values())  # greedy picks the most likely token
    assert out.cumulative_logprob == pytest.approx(sum(e[t] for t, e in zip(out.token_ids, out.logprobs)), abs=1e-4)


def test_bfloat16_logits_give_the_tokens_and_logprobs_of_float32_ones(tiny_llama_dir, tiny_prompts):
    """A bfloat16 model's logits reach the sampler as they are: greedy and plain seeded requests
    draw from them directly (on CUDA), requests with logprobs or a grammar read them widened to
    float32 (logprobs not rounded to bfloat16), and the tokens agree. Each kind runs in a batch
    of its own, since one request with logprobs widens its whole batch."""
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_memory=1 << 22, block_size=4,
              enable_prefix_caching=False, grammar_cache_dir=None)  # no cache hit: each run computes alike
    prompts = [{"prompt_token_ids": ids} for ids in tiny_prompts[:6]]

    def run(**kw) -> list:
        params = [SamplingParams(max_tokens=12, ignore_eos=True, seed=i, **kw) for i in range(len(prompts))]
        return [o.outputs[0] for o in llm.generate(prompts, params)]

    for temperature in (0.0, 0.8):
        plain, with_logprobs = run(temperature=temperature), run(temperature=temperature, logprobs=2)
        assert [o.token_ids for o in plain] == [o.token_ids for o in with_logprobs]
    logprobs = [v for o in with_logprobs for entry in o.logprobs for v in entry.values()]
    assert any(torch.tensor(v).bfloat16().item() != v for v in logprobs)
    guided = SamplingParams(max_tokens=8, temperature=1.0, seed=3,
                            structured_outputs=StructuredOutputsParams(regex=r"[0-9]{2,4}"))
    out = llm.generate(prompts[0], guided)[0].outputs[0]
    assert re.fullmatch(r"[0-9]{2,4}", out.text)
    assert_no_leaks(llm)


def test_max_tokens_and_finish_reasons(tiny_llm, tiny_prompts):
    out = tiny_llm.generate({"prompt_token_ids": tiny_prompts[1]}, greedy(3))[0]
    assert out.finished and out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 3
    first = out.outputs[0].token_ids[0]
    stopped = tiny_llm.generate({"prompt_token_ids": tiny_prompts[1]},
                                greedy(3, stop_token_ids=[first]))[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == first and stopped.token_ids == [first]


@pytest.mark.parametrize("kwargs,field", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(bogus=1), "bogus"),
])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_requests_are_rejected_without_leaking(tiny_llm):
    with pytest.raises(ValueError, match="max_model_len"):
        tiny_llm.generate({"prompt_token_ids": [5] * tiny_llm.engine.max_model_len}, greedy(4))
    with pytest.raises(ValueError, match="max_tokens"):
        tiny_llm.generate({"prompt_token_ids": [5, 6]}, greedy(tiny_llm.engine.max_model_len))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny_llm.generate({"prompt_token_ids": [5, 100000]}, greedy(4))
    with pytest.raises(ValueError, match="stop_token_ids"):
        tiny_llm.generate({"prompt_token_ids": [5]}, greedy(4, stop_token_ids=[10**6]))
    with pytest.raises(ValueError, match="logit_bias"):
        tiny_llm.generate({"prompt_token_ids": [5]}, greedy(4, logit_bias={10**6: 1.0}))
    with pytest.raises(ValueError, match="empty"):
        tiny_llm.generate({"prompt_token_ids": []}, greedy(4))
    with pytest.raises(ValueError, match="unknown engine argument"):
        LLM("whatever", max_num_sequences=3)
    assert_no_leaks(tiny_llm)


# ---- SmolLM2-135M-Instruct (the default model) ------------------------------------------------

@pytest.fixture(scope="module")
def smol_llm(smollm2_dir):
    return LLM(str(smollm2_dir), dtype="float32", kv_cache_memory=256 << 20)


@pytest.fixture(scope="module")
def smol_prompt_ids(smol_llm):
    tok = smol_llm.get_tokenizer()
    return [tok.encode(p) for p in PROMPTS]


def test_smollm2_staggered_batch_matches_hf(smol_llm, smollm2_dir, smol_prompt_ids):
    expected = hf_greedy(smollm2_dir, smol_prompt_ids, 16)
    single = smol_llm.generate({"prompt_token_ids": smol_prompt_ids[0]}, greedy(16))[0]
    assert single.outputs[0].token_ids == expected[0]
    assert run_staggered(smol_llm, smol_prompt_ids, greedy(16)) == expected
    assert_no_leaks(smol_llm)


def test_smollm2_chat_and_stop_strings(smol_llm):
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    full = smol_llm.chat(messages, SamplingParams(max_tokens=40, temperature=0.0))[0].outputs[0]
    assert full.finish_reason in ("stop", "length") and full.text
    # Pick a stop string from the middle of the greedy text: the output must end right before it.
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 3]
    cut = smol_llm.chat(messages, SamplingParams(max_tokens=40, temperature=0.0, stop=[stop]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full.text[:full.text.index(stop)]
    kept = smol_llm.chat(messages, SamplingParams(max_tokens=40, temperature=0.0, stop=[stop],
                                                  include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == full.text[:full.text.index(stop) + len(stop)]
    assert_no_leaks(smol_llm)
