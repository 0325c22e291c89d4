import pytest
import torch

from gdserve.config import EngineConfig, cpu_has_native_bf16, default_mask_workers, default_max_num_seqs


def test_auto_dtype_follows_the_cpus_bf16_support(monkeypatch):
    config = EngineConfig(device="cpu")
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert config.torch_dtype() == expected
    monkeypatch.setattr("gdserve.config.cpu_has_native_bf16", lambda: False)
    assert config.torch_dtype() == torch.float32
    assert EngineConfig(device="cpu", dtype="bf16").torch_dtype() == torch.bfloat16


def test_bad_dtype_is_named():
    with pytest.raises(ValueError, match="dtype must be 'auto' or one of"):
        EngineConfig(dtype="int4")


def test_kv_cache_dtype_defaults_to_the_models_and_takes_fp8():
    assert EngineConfig(device="cpu", dtype="float32").torch_kv_cache_dtype() == torch.float32
    assert EngineConfig(device="cpu", kv_cache_dtype="fp8").torch_kv_cache_dtype() == torch.float8_e4m3fn
    assert EngineConfig(device="cpu", kv_cache_dtype="fp8_e4m3").torch_kv_cache_dtype() == torch.float8_e4m3fn
    assert EngineConfig(device="cpu", kv_cache_dtype="fp8_e5m2").torch_kv_cache_dtype() == torch.float8_e5m2
    with pytest.raises(ValueError, match="kv_cache_dtype must be 'auto' or one of"):
        EngineConfig(kv_cache_dtype="int8")


def test_fp8_attention_needs_an_e4m3_cache():
    assert EngineConfig(device="cpu", kv_cache_dtype="fp8", fp8_attention=True).fp8_attention
    assert EngineConfig(device="cpu", kv_cache_dtype="fp8_e4m3", fp8_attention=True).fp8_attention
    for kv_cache_dtype in ("auto", "fp8_e5m2"):
        with pytest.raises(ValueError, match="fp8_attention needs kv_cache_dtype 'fp8'"):
            EngineConfig(device="cpu", kv_cache_dtype=kv_cache_dtype, fp8_attention=True)


def test_quantization_takes_fp8_and_the_packed_formats_and_names_a_bad_value():
    assert EngineConfig(device="cpu").quantization is None
    assert EngineConfig(device="cpu", quantization="fp8").quantization == "fp8"
    assert EngineConfig(device="cpu", quantization="awq").quantization == "awq"
    with pytest.raises(ValueError, match=r"quantization must be None or one of \['fp8', 'awq', 'gptq', 'gguf'\]"):
        EngineConfig(device="cpu", quantization="int4")


@pytest.mark.parametrize("cores,workers", [(1, 1), (2, 1), (4, 3), (16, 8), (128, 8)])
def test_compile_workers_default_to_the_usable_cores_less_one_capped(monkeypatch, cores, workers):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    assert EngineConfig(device="cpu").grammar_compile_workers == workers
    assert EngineConfig(device="cpu", grammar_compile_workers=32).grammar_compile_workers == 32
    with pytest.raises(ValueError, match="grammar_compile_workers must be >= 1"):
        EngineConfig(device="cpu", grammar_compile_workers=0)


@pytest.mark.parametrize("cores,workers", [(1, 1), (2, 1), (4, 2), (16, 14), (128, 16)])
def test_mask_workers_default_to_the_usable_cores_less_two_on_a_gpu_none_on_the_cpu(monkeypatch, cores, workers):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    assert default_mask_workers(torch.device("cuda")) == workers
    assert EngineConfig(device="cpu").grammar_mask_workers == 0
    assert EngineConfig(device="cpu", grammar_mask_workers=3).grammar_mask_workers == 3
    with pytest.raises(ValueError, match="grammar_mask_workers must be >= 0"):
        EngineConfig(device="cpu", grammar_mask_workers=-1)


@pytest.mark.parametrize("kwargs,message", [
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1"),
    (dict(tensor_parallel_size=2, enable_lora=True), "tensor_parallel_size 2 with enable_lora is not supported"),
    (dict(tensor_parallel_size=2, quantization="awq"), "tensor_parallel_size 2 with quantization 'awq'"),
    (dict(tensor_parallel_size=2, device="cuda:1"), "places rank r on cuda:r"),
])
def test_tensor_parallel_combinations_not_supported_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


@pytest.mark.parametrize("kv_tokens, budget, seats", [
    (23_000, 2048, 256),          # the CPU's default 1 GiB cache of the default model
    (600_000, 8192, 585),         # a seat per 1,024 tokens in between
    (1_700_000, 8192, 1024),      # an 8B model's fp8 cache on an H200: capped
    (1_700_000, 512, 512),        # no more seats than a step has tokens
])
def test_default_max_num_seqs_follows_the_kv_cache(kv_tokens, budget, seats):
    assert default_max_num_seqs(kv_tokens, budget) == seats


def test_max_num_seqs_is_left_to_the_engine_or_checked():
    assert EngineConfig(device="cpu").max_num_seqs is None
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        EngineConfig(device="cpu", max_num_seqs=0)


def test_forced_tokens_default_to_on_for_the_cpu_and_off_for_cuda():
    assert EngineConfig(device="cpu").enable_forced_tokens is True
    assert EngineConfig(device="cuda").enable_forced_tokens is False
    assert EngineConfig(device="cuda", enable_forced_tokens=True).enable_forced_tokens is True
    assert EngineConfig(device="cpu", enable_forced_tokens=False).enable_forced_tokens is False
