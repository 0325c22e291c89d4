"""Multi-LoRA in the engine: adapters against their merged models, mixed batches, slots and the CPU
cache, prefix caching, preemption and guided decoding with adapters, and the errors."""
import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from gdserve import LLM, SamplingParams
from gdserve.lora import LoRARequest
from gdserve.lora.adapter import LoRALoadError
from gdserve.sampling_params import StructuredOutputsParams
from tests.engine.test_llm import assert_no_leaks
from tests.helpers import save_merged_model, save_peft_adapter

pytest.importorskip("peft")

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:", "Water boils at"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_adapters(tiny_llama_dir, tmp_path_factory):
    """Three adapters over the tiny Llama: different ranks and targets, one with rsLoRA."""
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    root = tmp_path_factory.mktemp("tiny-adapters")
    specs = [dict(r=8, alpha=16, target_modules=ALL_PROJECTIONS),
             dict(r=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj")),
             dict(r=16, alpha=16, target_modules=("k_proj", "o_proj", "gate_proj"), use_rslora=True)]
    paths = []
    for i, spec in enumerate(specs):
        path = root / f"adapter{i}"
        save_peft_adapter(base, path, seed=i + 1, **spec)
        paths.append(path)
    return paths


def tiny_llm(model_dir, **kwargs) -> LLM:
    args = dict(dtype="float32", enable_lora=True, max_loras=4, max_lora_rank=16, kv_cache_memory=1 << 22)
    return LLM(str(model_dir), **{**args, **kwargs})


def requests(paths) -> list[LoRARequest]:
    return [LoRARequest(f"adapter{i}", i + 1, str(p)) for i, p in enumerate(paths)]


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_greedy_output_equals_the_merged_model(tiny_llama_dir, tiny_adapters, tmp_path):
    llm = tiny_llm(tiny_llama_dir)
    for i, lora in enumerate(requests(tiny_adapters)):
        merged = tmp_path / f"merged{i}"
        save_merged_model(tiny_llama_dir, lora.lora_path, merged)
        expected = tokens(LLM(str(merged), dtype="float32", kv_cache_memory=1 << 22).generate(PROMPTS, GREEDY))
        assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=lora)) == expected
    assert_no_leaks(llm)


def test_a_mixed_batch_gives_each_request_its_tokens_alone(tiny_llama_dir, tiny_adapters):
    llm = tiny_llm(tiny_llama_dir)
    loras = [None, *requests(tiny_adapters)]
    alone = [tokens(llm.generate(PROMPTS[i], GREEDY, lora_request=lora))[0] for i, lora in enumerate(loras)]
    mixed = tokens(llm.generate(PROMPTS, GREEDY, lora_request=loras))
    assert mixed == alone
    assert len({tuple(t) for t in alone}) == len(alone)  # every adapter changes the output
    assert_no_leaks(llm)


def test_more_adapters_than_slots_and_cpu_cache(tiny_llama_dir, tiny_adapters):
    """max_loras=1: a batch of three adapters runs one adapter at a time; max_cpu_loras=1: each
    is read back from disk when its turn comes."""
    reference = tokens(tiny_llm(tiny_llama_dir).generate(PROMPTS[:3], GREEDY, lora_request=requests(tiny_adapters)))
    llm = tiny_llm(tiny_llama_dir, max_loras=1, max_cpu_loras=1)
    loras = requests(tiny_adapters)
    assert tokens(llm.generate(PROMPTS[:3], GREEDY, lora_request=loras)) == reference
    assert len(llm.engine.list_loras()) <= 1
    assert_no_leaks(llm)


def test_prefix_cache_is_keyed_by_adapter(tiny_llama_dir, tiny_adapters):
    llm = tiny_llm(tiny_llama_dir)
    prompt = "A shared prompt long enough to fill a few KV blocks: " * 2
    lora_a, lora_b = requests(tiny_adapters)[:2]
    first = llm.generate(prompt, GREEDY, lora_request=lora_a)[0]
    again = llm.generate(prompt, GREEDY, lora_request=lora_a)[0]
    other = llm.generate(prompt, GREEDY, lora_request=lora_b)[0]
    base = llm.generate(prompt, GREEDY)[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
    assert other.num_cached_tokens == 0 and base.num_cached_tokens == 0
    assert tokens([other]) == tokens(tiny_llm(tiny_llama_dir, enable_prefix_caching=False)
                                     .generate(prompt, GREEDY, lora_request=lora_b))


def test_preemption_keeps_adapter_outputs(tiny_llama_dir, tiny_adapters):
    # 16 blocks of 4 tokens: six requests of up to ~50 tokens cannot all fit at once.
    loras = requests(tiny_adapters) * 2
    prompts = PROMPTS[:3] * 2
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    expected = tokens(tiny_llm(tiny_llama_dir).generate(prompts, params, lora_request=loras))
    per_block = 2 * 2 * 4 * 2 * 16 * 4  # K and V, 2 layers, 4 tokens, 2 KV heads, head dim 16, float32
    tight = tiny_llm(tiny_llama_dir, kv_cache_memory=16 * per_block, block_size=4, max_model_len=64,
                     max_num_batched_tokens=64, schedule_conservativeness=0)
    assert tight.engine.kv_cache.num_blocks == 16
    assert tokens(tight.generate(prompts, params, lora_request=loras)) == expected
    assert tight.engine.scheduler.num_preemptions > 0
    assert_no_leaks(tight)


def test_guided_decoding_with_an_adapter(tiny_llama_dir, tiny_adapters):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=60,
                            structured_outputs=StructuredOutputsParams(json=schema))
    out = tiny_llm(tiny_llama_dir).generate(PROMPTS, params, lora_request=requests(tiny_adapters)[0])
    for o in out:
        assert set(json.loads(o.outputs[0].text)) == {"name"}


def test_smollm2_adapter_equals_merged(smollm2_dir, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    adapter = tmp_path / "adapter"
    save_peft_adapter(base, adapter, r=8, alpha=16, target_modules=ALL_PROJECTIONS, seed=5)
    merged = tmp_path / "merged"
    save_merged_model(smollm2_dir, adapter, merged)
    del base
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = tokens(LLM(str(merged), dtype="float32").generate(PROMPTS[:2], params))
    llm = LLM(str(smollm2_dir), dtype="float32", enable_lora=True, max_lora_rank=8)
    assert tokens(llm.generate(PROMPTS[:2], params, lora_request=LoRARequest("a", 1, str(adapter)))) == expected


def test_adapter_management(tiny_llama_dir, tiny_adapters):
    engine = tiny_llm(tiny_llama_dir).engine
    lora = requests(tiny_adapters)[0]
    assert engine.add_lora(lora) is True and engine.add_lora(lora) is False
    assert engine.list_loras() == {1}
    with pytest.raises(LoRALoadError, match="already"):
        engine.add_lora(LoRARequest("other", 1, str(tiny_adapters[1])))
    assert engine.remove_lora(1) is True and engine.remove_lora(1) is False
    assert engine.list_loras() == set()


def test_errors_name_the_problem(tiny_llama_dir, tiny_adapters, tmp_path):
    plain = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22)
    with pytest.raises(ValueError, match="enable_lora"):
        plain.generate("x", GREEDY, lora_request=requests(tiny_adapters)[0])
    llm = tiny_llm(tiny_llama_dir, max_lora_rank=8)
    with pytest.raises(LoRALoadError, match="rank"):
        llm.generate("x", GREEDY, lora_request=LoRARequest("big", 3, str(tiny_adapters[2])))
    with pytest.raises(LoRALoadError):
        llm.generate("x", GREEDY, lora_request=LoRARequest("missing", 4, str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="per prompt"):
        llm.generate(["x", "y"], GREEDY, lora_request=requests(tiny_adapters)[:1])
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LLM(str(tiny_llama_dir), enable_lora=True, max_loras=2, max_cpu_loras=1)
    assert_no_leaks(llm)


def test_an_adapter_gone_from_disk_fails_only_its_requests(tiny_llama_dir, tiny_adapters, tmp_path):
    """max_cpu_loras=1 drops the first adapter from memory when the second is read; its directory
    is gone by the time its requests run: they fail, the others finish."""
    gone = tmp_path / "gone"
    shutil.copytree(tiny_adapters[0], gone)
    engine = tiny_llm(tiny_llama_dir, max_loras=1, max_cpu_loras=1).engine
    doomed = engine.add_request([5, 6, 7], GREEDY, lora_request=LoRARequest("gone", 1, str(gone)))
    fine = engine.add_request([5, 6, 7], GREEDY, lora_request=requests(tiny_adapters)[1])
    plain = engine.add_request([5, 6, 7], GREEDY)
    shutil.rmtree(gone)
    engine.remove_lora(1)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert finished[doomed].error and "gone" in finished[doomed].error
    assert not finished[fine].error and len(finished[fine].outputs[0].token_ids) == GREEDY.max_tokens
    assert not finished[plain].error


def test_warm_up_launches_the_lora_kernels_of_each_layer_shape_at_every_row_count(tiny_llama_dir, monkeypatch):
    """Triton compiles the LoRA kernels per row-count variant: the warm-up must meet them all."""
    from gdserve.engine import model_runner
    llm = tiny_llm(tiny_llama_dir, max_loras=2)
    launched: dict[tuple, list[int]] = {}

    def record(y, x, lora_a, lora_b, shard_sizes, mapping):
        launched.setdefault((x.shape[1], tuple(shard_sizes)), []).append(x.shape[0])

    monkeypatch.setattr(model_runner, "add_lora", record)
    llm.engine.runner.warm_up(max_num_seqs=4, max_num_tokens=40, max_model_len=64)
    assert len(launched) == 4  # qkv, o, gate_up, down
    assert all(rows == list(range(1, 41)) for rows in launched.values())
