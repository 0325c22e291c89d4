from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from tests.quant.checkpoints import save_gguf, save_quantized


@pytest.fixture(scope="session")
def awq_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(AWQ checkpoint, group 64, zero points; its dequantized twin)"""
    return save_quantized(tmp_path_factory.mktemp("awq"), "awq", group_size=64)


@pytest.fixture(scope="session")
def gptq_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(GPTQ 4-bit sym, group 64, the original format with its zero offset; its dequantized twin)"""
    return save_quantized(tmp_path_factory.mktemp("gptq"), "gptq", group_size=64, sym=True)


@pytest.fixture(scope="session")
def gptq_desc_act_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(GPTQ 4-bit asym, desc_act, group 32, gptq_v2 format; its dequantized twin)"""
    return save_quantized(tmp_path_factory.mktemp("gptq-act"), "gptq", group_size=32, desc_act=True,
                          checkpoint_format="gptq_v2")


@pytest.fixture(scope="session")
def gguf_files(tmp_path_factory) -> tuple[Path, Path]:
    """(a GGUF mixing Q4_0, Q4_1 and Q8_0 linear layers; the dir of its config and dequantized twin)"""
    return save_gguf(tmp_path_factory.mktemp("gguf"), {"q_proj": GGMLQuantizationType.Q4_0,
                                                       "v_proj": GGMLQuantizationType.Q8_0,
                                                       "down_proj": GGMLQuantizationType.Q8_0})
