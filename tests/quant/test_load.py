"""Quantized checkpoints load packed: the weights dequantize exactly to the checkpoint's, and the
model computes as its dequantized twin does, in the engine too (greedy, guided)."""
import json

import jsonschema
import pytest
import torch

from gdserve import LLM, SamplingParams
from gdserve.config import EngineConfig
from gdserve.engine.model_runner import ModelRunner
from gdserve.layers.packed_linear import PackedLinear
from gdserve.models import ALIASES, DEFAULT_MODEL, load_model
from gdserve.sampling_params import StructuredOutputsParams
from tests.helpers import run_prefill_and_decode

PROMPT = list(range(3, 40))
FORMATS = ["awq_dirs", "gptq_dirs", "gptq_desc_act_dirs", "gguf_files"]


def load_pair(request, fixture: str, dtype=torch.float32):
    """(packed model, dequantized twin) of a fixture's checkpoint."""
    if fixture == "gguf_files":
        gguf, dense = request.getfixturevalue(fixture)
        packed, _ = load_model(dense, dtype, quantization="gguf", gguf_file=gguf)
    else:
        quantized, dense = request.getfixturevalue(fixture)
        packed, _ = load_model(quantized, dtype)
    return packed, load_model(dense, dtype)[0]


def packed_layers(model) -> dict[str, PackedLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, PackedLinear)}


@pytest.mark.parametrize("fixture", FORMATS)
def test_packed_weights_dequantize_to_exactly_the_checkpoints(request, fixture):
    packed, dense = load_pair(request, fixture)
    layers = packed_layers(packed)
    assert len(layers) == 2 * 4  # qkv, o, gate_up, down in each layer; the LM head stays dense
    assert not isinstance(packed.lm_head, PackedLinear) and not isinstance(packed.model.embed_tokens, PackedLinear)
    for name, layer in layers.items():
        expected = dense.get_submodule(name).weight.detach().t()           # [K, N]
        if layer.perm is not None:
            expected = expected[layer.perm]
        assert torch.equal(layer.packed.dequantize(), expected), name
    assert (packed_layers(packed)["model.layers.0.self_attn.qkv_proj"].perm is not None) == (fixture == "gptq_desc_act_dirs")


@pytest.mark.parametrize("fixture", FORMATS)
def test_logits_and_greedy_tokens_match_the_dequantized_model(request, fixture):
    packed, dense = load_pair(request, fixture)
    torch.testing.assert_close(run_prefill_and_decode(packed, PROMPT, 20), run_prefill_and_decode(dense, PROMPT, 20),
                               atol=1e-4, rtol=1e-4)
    tokens = {"packed": PROMPT[:8], "dense": PROMPT[:8]}
    for _ in range(12):
        for key, model in (("packed", packed), ("dense", dense)):
            logits = run_prefill_and_decode(model, tokens[key], len(tokens[key]))
            tokens[key].append(int(logits[-1].argmax()))
    assert tokens["packed"] == tokens["dense"]


@pytest.mark.parametrize("fixture", FORMATS)
def test_a_device_that_takes_the_mma_layout_gets_every_4_bit_layer_repacked(request, fixture, monkeypatch):
    """As on CUDA: the loader repacks each 4-bit layer once its shards are in (finish_loading);
    8-bit layers keep the rows layout. The CPU multiplies an mma weight as the rows one."""
    from gdserve.kernels.packed_gemm import to_mma
    from gdserve.layers import packed_linear
    rows, _ = load_pair(request, fixture)
    monkeypatch.setattr(packed_linear, "device_layout", lambda w: to_mma(w) if w.bits == 4 else w)
    mma, _ = load_pair(request, fixture)
    for name, layer in packed_layers(mma).items():
        assert layer.layout == ("mma" if layer.bits == 4 else "rows"), name
        assert torch.equal(layer.packed.dequantize(), packed_layers(rows)[name].packed.dequantize()), name
    assert any(layer.layout == "mma" for layer in packed_layers(mma).values())
    torch.testing.assert_close(run_prefill_and_decode(mma, PROMPT, 20), run_prefill_and_decode(rows, PROMPT, 20),
                               atol=0, rtol=0)


def engine(path) -> LLM:
    return LLM(str(path), dtype="float32", device="cpu", kv_cache_memory=1 << 20, block_size=4,
               max_model_len=128, grammar_compile_workers=1)


@pytest.mark.parametrize("fixture", ["awq_dirs", "gptq_desc_act_dirs"])
def test_the_engine_finds_the_format_and_decodes_as_the_dequantized_model(request, fixture):
    quantized, dense = request.getfixturevalue(fixture)
    prompts = [{"prompt_token_ids": PROMPT[:n]} for n in (3, 9, 20)]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    llm = engine(quantized)
    assert len(packed_layers(llm.engine.model)) == 8
    got = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    assert got == [out.outputs[0].token_ids for out in engine(dense).generate(prompts, params)]


def test_guided_json_on_a_packed_model(awq_dirs):
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["id", "ok"], "additionalProperties": False}
    params = SamplingParams(max_tokens=96, temperature=0.0, structured_outputs=StructuredOutputsParams(json=schema))
    out = engine(awq_dirs[0]).generate({"prompt_token_ids": PROMPT[:5]}, params)[0]
    jsonschema.validate(json.loads(out.outputs[0].text), schema)


def test_dummy_weights_are_quantized_at_load_and_warm_up_covers_packed_layers(awq_dirs):
    _, dense = awq_dirs
    model, config = load_model(dense, load_format="dummy", quantization="awq")
    layers = packed_layers(model)
    assert {(m.bits, m.group_size) for m in layers.values()} == {(4, 128)}
    assert torch.isfinite(run_prefill_and_decode(model, PROMPT, 30)).all()
    runner = ModelRunner(model, config, num_blocks=16, block_size=4, device=torch.device("cpu"),
                         kv_cache_dtype=torch.float32)
    assert {type(m) for m in runner._distinct_linears()} == {PackedLinear}
    runner.warm_up(max_num_seqs=2, max_num_tokens=8, max_model_len=32)


def test_requests_the_checkpoint_cannot_meet_are_refused(awq_dirs):
    quantized, dense = awq_dirs
    with pytest.raises(ValueError, match="'awq' needs a checkpoint quantized with it"):
        load_model(dense, quantization="awq")
    with pytest.raises(ValueError, match="'gptq' was requested, but the checkpoint is quantized with quant_method 'awq'"):
        load_model(quantized, quantization="gptq")
    with pytest.raises(ValueError, match="'gguf' needs a .gguf model"):
        load_model(dense, quantization="gguf")
    with pytest.raises(ValueError, match=r"quantization must be None or one of \['fp8', 'awq', 'gptq', 'gguf'\]"):
        EngineConfig(device="cpu", quantization="int4")


def test_the_default_models_q4_1_gguf_loads_packed_at_about_a_quarter_of_bf16(smollm2_dir):
    gguf = ALIASES[DEFAULT_MODEL].path()
    packed, _ = load_model(smollm2_dir, torch.bfloat16, quantization="gguf", gguf_file=gguf)
    layers = packed_layers(packed)
    assert len(layers) == 30 * 4 and {(m.bits, m.group_size) for m in layers.values()} == {(4, 32)}
    packed_bytes = sum(m.num_bytes() for m in layers.values())
    bf16_bytes = sum(m.in_features * m.out_features * 2 for m in layers.values())
    # 4 bits a weight plus a bf16 scale and bias per 32: 5 / 16 of bf16
    assert 0.25 <= packed_bytes / bf16_bytes <= 0.33
    dense, _ = load_model(smollm2_dir, torch.bfloat16)
    dense_bytes = sum(p.numel() * p.element_size() for name, p in dense.named_parameters() if "proj" in name)
    assert dense_bytes == bf16_bytes


def test_the_default_models_packed_weights_equal_its_dequantized_ones(smollm2_dir):
    gguf = ALIASES[DEFAULT_MODEL].path()
    packed, _ = load_model(smollm2_dir, quantization="gguf", gguf_file=gguf)
    dense, _ = load_model(smollm2_dir)
    for name in ("model.layers.0.self_attn.qkv_proj", "model.layers.29.mlp.gate_up_proj", "model.layers.7.mlp.down_proj"):
        layer = packed.get_submodule(name)
        assert torch.equal(layer.packed.dequantize(), dense.get_submodule(name).weight.detach().t()), name
    torch.testing.assert_close(run_prefill_and_decode(packed, PROMPT, 30), run_prefill_and_decode(dense, PROMPT, 30),
                               atol=2e-3, rtol=2e-3)
