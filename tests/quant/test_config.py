"""Which packed format a checkpoint loads in, and the clear refusals."""
import pytest

from gdserve.quant.config import PackedQuantConfig, packed_quant_config, resolve_method

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}


def test_the_checkpoints_method_is_found_without_asking():
    assert resolve_method(None, AWQ, "auto", has_gguf=False) == "awq"
    assert resolve_method("gptq", GPTQ, "auto", has_gguf=False) == "gptq"
    assert resolve_method(None, None, "auto", has_gguf=True) is None  # GGUF dequantizes unless asked
    assert resolve_method("gguf", None, "auto", has_gguf=True) == "gguf"
    assert resolve_method("fp8", None, "auto", has_gguf=False) is None
    assert resolve_method("awq", None, "dummy", has_gguf=False) == "awq"


def test_a_request_contradicting_the_checkpoint_or_without_one_is_refused():
    with pytest.raises(ValueError, match="'gptq' was requested, but the checkpoint is quantized with quant_method 'awq'"):
        resolve_method("gptq", AWQ, "auto", has_gguf=False)
    with pytest.raises(ValueError, match="'awq' needs a checkpoint quantized with it"):
        resolve_method("awq", None, "auto", has_gguf=False)
    with pytest.raises(ValueError, match="'gguf' needs a .gguf model"):
        resolve_method("gguf", None, "auto", has_gguf=False)
    with pytest.raises(ValueError, match=r"quant_method 'exl2' are not supported \(supported: awq, gptq\)"):
        resolve_method(None, {"quant_method": "exl2"}, "auto", has_gguf=False)


def test_parameters_as_vllm_reads_them():
    assert packed_quant_config("awq", {**AWQ, "w_bit": 4, "q_group_size": 64}, "auto") == PackedQuantConfig("awq", 4, 64)
    assert packed_quant_config("gptq", GPTQ, "auto").zero_offset == 1  # the original format
    assert packed_quant_config("gptq", {**GPTQ, "checkpoint_format": "gptq_v2"}, "auto").zero_offset == 0
    assert packed_quant_config("gptq", {**GPTQ, "bits": 8, "group_size": -1}, "auto").group_size == -1
    assert packed_quant_config("awq", None, "dummy") == PackedQuantConfig("awq", 4, 128, rtn=True)


@pytest.mark.parametrize("method,quant,message", [
    ("awq", {**AWQ, "bits": 3}, "AWQ with 3-bit weights is not supported"),
    ("awq", {**AWQ, "version": "gemv"}, "AWQ version 'gemv' is not supported"),
    ("awq", {**AWQ, "version": "marlin"}, "AWQ version 'marlin' is not supported"),
    ("awq", {**AWQ, "zero_point": False}, "without zero points"),
    ("gptq", {**GPTQ, "bits": 3}, "GPTQ with 3-bit weights is not supported"),
    ("gptq", {**GPTQ, "bits": 2}, "GPTQ with 2-bit weights is not supported"),
    ("gptq", {**GPTQ, "checkpoint_format": "marlin"}, "checkpoint_format 'marlin' is not supported"),
    ("gptq", {**GPTQ, "is_marlin_format": True}, "checkpoint_format 'marlin' is not supported"),
    ("gptq", {**GPTQ, "group_size": 0}, "group_size 0: expected a positive int"),
])
def test_unsupported_variants_are_named(method, quant, message):
    with pytest.raises(ValueError, match=message):
        packed_quant_config(method, quant, "auto")
