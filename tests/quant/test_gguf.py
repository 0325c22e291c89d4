"""GGUF block formats -> PackedWeight, against the gguf package's own quantize and dequantize."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from gdserve.kernels.packed_gemm import PackedWeight
from gdserve.quant.config import PackedProjection
from gdserve.quant.gguf import GGUFCheckpoint


def write_gguf(path, tensors: dict, architecture: str = "llama"):
    writer = GGUFWriter(path, architecture)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFCheckpoint(path)


@pytest.mark.parametrize("qtype,bits", [(GGMLQuantizationType.Q4_0, 4), (GGMLQuantizationType.Q4_1, 4),
                                        (GGMLQuantizationType.Q8_0, 8)])
def test_blocks_become_packed_weights_that_dequantize_exactly(tmp_path, qtype, bits):
    rows = np.random.default_rng(0).normal(size=(48, 128)).astype(np.float32)   # [N, K]
    data = quantize(rows, qtype)
    checkpoint = write_gguf(tmp_path / "t.gguf", {"blk.0.ffn_up.weight": (data, qtype)})
    assert checkpoint.linear_layouts() == {"model.layers.0.mlp.up_proj": (bits, 32)}
    [(name, projection)] = list(checkpoint.weights(4, 2, torch.float32))
    assert name == "model.layers.0.mlp.up_proj" and isinstance(projection, PackedProjection)
    weight = projection.weight
    assert isinstance(weight, PackedWeight) and (weight.bits, weight.group_size) == (bits, 32)
    assert weight.qweight.shape == (128 * bits // 32, 48) and weight.scales.shape == (4, 48)
    assert torch.equal(weight.dequantize(), torch.from_numpy(dequantize(data, qtype)).t())


def test_dense_tensors_are_dequantized_under_hf_names(tmp_path):
    embedding = np.random.default_rng(0).normal(size=(10, 64)).astype(np.float32)
    norm = np.ones(64, dtype=np.float32)
    data = quantize(embedding, GGMLQuantizationType.Q8_0)
    checkpoint = write_gguf(tmp_path / "t.gguf", {"token_embd.weight": (data, GGMLQuantizationType.Q8_0),
                                                  "blk.1.ffn_norm.weight": (norm, GGMLQuantizationType.F32)})
    weights = dict(checkpoint.weights(4, 2, torch.float32))
    assert torch.equal(weights["model.embed_tokens.weight"],
                       torch.from_numpy(dequantize(data, GGMLQuantizationType.Q8_0)))
    assert torch.equal(weights["model.layers.1.post_attention_layernorm.weight"], torch.ones(64))


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q5_0, GGMLQuantizationType.F16])
def test_a_linear_layer_in_another_type_is_refused_naming_it(tmp_path, qtype):
    rows = np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32)
    data = quantize(rows, qtype) if qtype != GGMLQuantizationType.F16 else rows.astype(np.float16)
    checkpoint = write_gguf(tmp_path / "t.gguf", {"blk.0.attn_v.weight": (data, qtype)})
    with pytest.raises(ValueError, match=f"blk.0.attn_v.weight is {qtype.name}: quantization 'gguf' keeps only "
                                         "Q4_0, Q4_1, Q8_0 packed; load without it"):
        checkpoint.linear_layouts()


def test_an_unsupported_architecture_is_named(tmp_path):
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported"):
        write_gguf(tmp_path / "t.gguf", {"output_norm.weight": (np.ones(4, np.float32), GGMLQuantizationType.F32)},
                   architecture="gpt2")
