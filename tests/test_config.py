import pytest
import torch

from gdserve.config import EngineConfig, cpu_has_native_bf16


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
