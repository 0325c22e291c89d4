import copy
import datetime
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from gdserve.lora.adapter import LoRAAdapter, LoRALoadError, load_adapter
from gdserve.models import load_model
from gdserve.models.llama import FUSED
from tests.helpers import save_merged_model, save_peft_adapter

pytest.importorskip("peft")

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYER0 = "base_model.model.model.layers.0"


@pytest.fixture(scope="module")
def hf_tiny(tiny_llama_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return load_model(tiny_llama_dir)[0]


def hf_names(module: str) -> list[str]:
    """Our module name -> the HF projections it holds, shard by shard."""
    parent, _, leaf = module.rpartition(".")
    return [f"{parent}.{hf}" for hf in FUSED[leaf]] if leaf in FUSED else [module]


def our_deltas(adapter: LoRAAdapter) -> dict[str, torch.Tensor]:
    """HF projection -> B_scaled @ A, for every shard the adapter fills."""
    return {name: b.float() @ a.float() for module, layer in adapter.layers.items()
            for name, a, b in zip(hf_names(module), layer.lora_a, layer.lora_b, strict=True)
            if a is not None}


def peft_deltas(peft_model, hf_model) -> dict[str, torch.Tensor]:
    """HF projection -> W_merged - W_base after peft's merge_and_unload, where it is not zero."""
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    deltas = {name.removesuffix(".weight"): merged[name] - weight
              for name, weight in hf_model.state_dict().items() if name.endswith("_proj.weight")}
    return {name: delta for name, delta in deltas.items() if delta.abs().max() > 0}


def assert_matches_peft(adapter: LoRAAdapter, peft_model, hf_model) -> None:
    ours, theirs = our_deltas(adapter), peft_deltas(peft_model, hf_model)
    assert sorted(ours) == sorted(theirs)
    for name, delta in theirs.items():
        torch.testing.assert_close(ours[name], delta, atol=1e-6, rtol=1e-4, msg=name)


def load(path, model, max_rank=64, **kwargs) -> LoRAAdapter:
    return load_adapter(str(path), model, max_rank, **kwargs)


def test_every_projection_matches_peft(hf_tiny, tiny, tmp_path):
    peft_model = save_peft_adapter(hf_tiny, tmp_path, r=8, alpha=16, target_modules=ALL)
    adapter = load(tmp_path, tiny)
    assert adapter.rank == 8 and adapter.path == str(tmp_path)
    assert list(adapter.layers) == [f"model.layers.{i}.{m}" for i in range(2) for m in
                                    ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]
    qkv = adapter.layers["model.layers.0.self_attn.qkv_proj"]
    assert [tuple(a.shape) for a in qkv.lora_a] == [(8, 64)] * 3
    assert [tuple(b.shape) for b in qkv.lora_b] == [(64, 8), (32, 8), (32, 8)]  # GQA: k, v are half of q
    assert all(t.device.type == "cpu" and t.dtype == torch.float32
               for layer in adapter.layers.values() for t in (*layer.lora_a, *layer.lora_b))
    # fp32 x 2 layers x r=8 x (A's in_features + B's out_features over qkv, o, gate_up, down)
    assert adapter.num_bytes() == 4 * 2 * 8 * ((3 * 64 + 128) + (64 + 64) + (2 * 64 + 256) + (128 + 64))
    assert_matches_peft(adapter, peft_model, hf_tiny)


def test_module_outputs_match_peft_forward(hf_tiny, tiny, tmp_path):
    """x @ A.T @ B.T per shard, concatenated over our fused module, is what peft's layer adds."""
    peft_model = save_peft_adapter(hf_tiny, tmp_path, alpha=32, target_modules=("q_proj", "v_proj", "up_proj"))
    adapter = load(tmp_path, tiny)
    x = torch.randn(5, 64)
    with torch.no_grad():
        for module, layer in adapter.layers.items():
            ours = torch.cat([x @ a.T @ b.T if a is not None else torch.zeros(5, size)
                              for a, b, size in zip(layer.lora_a, layer.lora_b,
                                                    tiny.get_submodule(module).shard_sizes)], dim=-1)
            peft_layers = [peft_model.get_submodule(f"base_model.model.{name}") for name in hf_names(module)]
            theirs = torch.cat([m(x) - m.base_layer(x) if hasattr(m, "base_layer") else m(x) * 0
                                for m in peft_layers], dim=-1)
            torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-4)
    qkv = adapter.layers["model.layers.1.self_attn.qkv_proj"]
    assert [a is None for a in qkv.lora_a] == [False, True, False]
    assert [a is None for a in adapter.layers["model.layers.1.mlp.gate_up_proj"].lora_a] == [True, False]
    assert not any(name.endswith(("o_proj", "down_proj")) for name in adapter.layers)


def test_rslora_scales_by_sqrt_rank(hf_tiny, tiny, tmp_path):
    peft_model = save_peft_adapter(hf_tiny, tmp_path, r=16, alpha=8, use_rslora=True)
    adapter = load(tmp_path, tiny)
    assert_matches_peft(adapter, peft_model, hf_tiny)
    plain = load_file(tmp_path / "adapter_model.safetensors")[f"{LAYER0}.mlp.down_proj.lora_B.weight"]
    torch.testing.assert_close(adapter.layers["model.layers.0.mlp.down_proj"].lora_b[0], plain * 8 / 4)


def test_rank_and_alpha_patterns(hf_tiny, tiny, tmp_path):
    peft_model = save_peft_adapter(hf_tiny, tmp_path, r=8, alpha=16,
                                   rank_pattern={"q_proj": 4, r"layers\.1\.mlp\.down_proj": 24},
                                   alpha_pattern={"v_proj": 3, "gate_proj": 40})
    adapter = load(tmp_path, tiny, max_rank=24)
    assert adapter.rank == 24
    assert adapter.layers["model.layers.0.self_attn.qkv_proj"].lora_a[0].shape == (4, 64)
    assert adapter.layers["model.layers.0.mlp.down_proj"].lora_a[0].shape == (8, 128)
    assert adapter.layers["model.layers.1.mlp.down_proj"].lora_a[0].shape == (24, 128)
    assert_matches_peft(adapter, peft_model, hf_tiny)


def test_regex_target_modules(hf_tiny, tiny, tmp_path):
    peft_model = save_peft_adapter(hf_tiny, tmp_path, target_modules=r".*layers\.1\.self_attn\.(k|o)_proj")
    adapter = load(tmp_path, tiny)
    assert list(adapter.layers) == ["model.layers.1.self_attn.qkv_proj", "model.layers.1.self_attn.o_proj"]
    assert_matches_peft(adapter, peft_model, hf_tiny)


def test_layers_to_transform(hf_tiny, tiny, tmp_path):
    peft_model = save_peft_adapter(hf_tiny, tmp_path, target_modules=("q_proj", "up_proj"),
                                   layers_to_transform=[1], layers_pattern="layers")
    adapter = load(tmp_path, tiny)
    assert list(adapter.layers) == ["model.layers.1.self_attn.qkv_proj", "model.layers.1.mlp.gate_up_proj"]
    assert_matches_peft(adapter, peft_model, hf_tiny)


def test_exclude_modules(hf_tiny, tiny, tmp_path):
    peft_model = save_peft_adapter(hf_tiny, tmp_path, target_modules=("o_proj", "down_proj"),
                                   exclude_modules=["model.layers.0.mlp.down_proj"])
    adapter = load(tmp_path, tiny)
    assert "model.layers.0.mlp.down_proj" not in adapter.layers and "model.layers.1.mlp.down_proj" in adapter.layers
    assert_matches_peft(adapter, peft_model, hf_tiny)


def test_bin_checkpoint(hf_tiny, tiny, tmp_path):
    peft_model = save_peft_adapter(hf_tiny, tmp_path, target_modules=("k_proj", "gate_proj"),
                                   safe_serialization=False)
    assert (tmp_path / "adapter_model.bin").is_file() and not (tmp_path / "adapter_model.safetensors").exists()
    assert_matches_peft(load(tmp_path, tiny), peft_model, hf_tiny)


@pytest.fixture(scope="module")
def adapter_dir(hf_tiny, tmp_path_factory):
    """A valid adapter on every projection of the tiny model, r=8."""
    path = tmp_path_factory.mktemp("adapter")
    save_peft_adapter(hf_tiny, path)
    return path


def variant(adapter_dir, tmp_path, config: dict | None = None, tensors=None):
    """A copy of adapter_dir with config keys replaced and tensors rewritten by tensors(dict) -> dict."""
    path = tmp_path / "variant"
    shutil.copytree(adapter_dir, path)
    file = path / "adapter_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **(config or {})}))
    if tensors is not None:
        weights = path / "adapter_model.safetensors"
        save_file(tensors(load_file(weights)), weights)
    return path


def assert_same_layers(a: LoRAAdapter, b: LoRAAdapter) -> None:
    assert a.layers.keys() == b.layers.keys()
    for name in a.layers:
        for x, y in zip(a.layers[name].lora_a + a.layers[name].lora_b,
                        b.layers[name].lora_a + b.layers[name].lora_b, strict=True):
            assert torch.equal(x, y)


def test_keys_with_adapter_name(adapter_dir, tiny, tmp_path):
    named = variant(adapter_dir, tmp_path, tensors=lambda t: {
        k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."): v
        for k, v in t.items()})
    assert_same_layers(load(named, tiny), load(adapter_dir, tiny))


@pytest.mark.parametrize("config", [
    {"target_modules": "all-linear"},  # peft's shorthand, which it expands before saving
    # lora_A / lora_B are [r, in] / [out, r] whatever the flag (it transposes only Conv1D base weights)
    {"fan_in_fan_out": True},
])
def test_equivalent_configs(adapter_dir, tiny, tmp_path, config):
    assert_same_layers(load(variant(adapter_dir, tmp_path, config), tiny), load(adapter_dir, tiny))


def test_dtype_casts_after_scaling(adapter_dir, tiny):
    fp32, bf16 = load(adapter_dir, tiny), load(adapter_dir, tiny, dtype=torch.bfloat16)
    layer, ref = bf16.layers["model.layers.0.mlp.gate_up_proj"], fp32.layers["model.layers.0.mlp.gate_up_proj"]
    assert {t.dtype for t in layer.lora_a + layer.lora_b} == {torch.bfloat16}
    assert torch.equal(layer.lora_b[1], ref.lora_b[1].bfloat16())
    assert bf16.num_bytes() * 2 == fp32.num_bytes()


def test_rank_over_max_rank_names_both(adapter_dir, tiny):
    with pytest.raises(LoRALoadError, match=r"rank 8 \(at model.layers.0.self_attn.q_proj\) exceeds max_lora_rank 4"):
        load(adapter_dir, tiny, max_rank=4)


def test_rank_pattern_over_max_rank(adapter_dir, tiny, tmp_path):
    path = variant(adapter_dir, tmp_path, {"rank_pattern": {r"layers\.1\.mlp\.up_proj": 32}})
    with pytest.raises(LoRALoadError, match=r"rank 32 \(at model.layers.1.mlp.up_proj\) exceeds max_lora_rank 16"):
        load(path, tiny, max_rank=16)


@pytest.mark.parametrize("config, message", [
    ({"peft_type": "IA3"}, "peft_type is 'IA3': only LoRA"),
    ({"use_dora": True}, "use_dora=True: DoRA is not supported"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save=.*fully trained modules"),
    ({"bias": "lora_only"}, "bias='lora_only'"),
    ({"lora_bias": True}, "lora_bias=True"),
    ({"init_lora_weights": "pissa_niter_4"}, "init_lora_weights='pissa_niter_4' rewrites the base weights"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "target modules model.embed_tokens cannot be served"),
    ({"target_modules": ["lm_head", "v_proj"]}, "target modules lm_head cannot be served"),
    ({"target_modules": r".*\.\d+\.(self_attn|input_layernorm)"},
     "target modules model.layers.N.self_attn, model.layers.N.input_layernorm cannot be served"),
    ({"target_modules": ["c_attn"]}, r"target_modules \['c_attn'\] match no projection"),
    ({"target_modules": "(q_proj"}, "target_modules '\\(q_proj' is not a valid regex"),
    ({"target_modules": None}, "target_modules must be a regex string or a non-empty list"),
    ({"r": 0}, "r must be a positive integer"),
    ({"layers_to_transform": "1"}, "layers_to_transform must be an integer or a list of them, got '1'"),
    ({"layers_to_transform": [1], "layers_pattern": 3}, "layers_pattern must be a string or a list of them"),
    ({"rank_pattern": {"q_proj": "4"}}, "rank_pattern must map module patterns to positive integers"),
    ({"alpha_pattern": {"(v": 4}}, "alpha_pattern '\\(v' is not a valid regex"),
])
def test_config_errors(adapter_dir, tiny, tmp_path, config, message):
    with pytest.raises(LoRALoadError, match=f"adapter_config.json: {message}"):
        load(variant(adapter_dir, tmp_path, config), tiny)


def without(key):
    return lambda t: {k: v for k, v in t.items() if k != key}


def with_tensor(key, value):
    return lambda t: {**t, key: value}


@pytest.mark.parametrize("config, tensors, message", [
    ({}, without(f"{LAYER0}.mlp.down_proj.lora_B.weight"),
     f"missing tensors .*: {LAYER0}.mlp.down_proj.lora_B.weight$"),
    ({}, with_tensor(f"{LAYER0}.self_attn.k_proj.lora_B.weight", torch.zeros(64, 8)),  # no GQA
     rf"tensor '{LAYER0}.self_attn.k_proj.lora_B.weight' has shape \(64, 8\); the model needs \(32, 8\)"),
    ({}, with_tensor(f"{LAYER0}.mlp.up_proj.lora_A.weight", torch.zeros(16, 64)),
     r"shape \(16, 64\); the model needs \(8, 64\) \(rank 8 x in_features\)"),
    ({}, with_tensor(f"{LAYER0}.self_attn.q_proj.lora_A.weight", torch.zeros(8, 64, dtype=torch.int32)),
     "is torch.int32, not floating point"),
    ({}, with_tensor("base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight", torch.zeros(8, 64)),
     "maps to no projection of the model"),
    ({"target_modules": ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]}, None,
     r"o_proj.lora_A.weight' is for model.layers.0.self_attn.o_proj, which target_modules does not select"),
    ({}, with_tensor(f"{LAYER0}.self_attn.q_proj.lora_magnitude_vector", torch.zeros(64)), "is not a LoRA weight"),
    ({}, with_tensor("base_model.model.model.embed_tokens.lora_embedding_A", torch.zeros(8, 259)),
     "is not a LoRA weight"),
    ({}, with_tensor(f"{LAYER0}.self_attn.v_proj.lora_A.extra.weight", torch.zeros(8, 64)),
     r"lora_A.*weight' and '.*lora_A.*weight' are both lora_A of model.layers.0.self_attn.v_proj$"),
])
def test_tensor_errors(adapter_dir, tiny, tmp_path, config, tensors, message):
    with pytest.raises(LoRALoadError, match=message):
        load(variant(adapter_dir, tmp_path, config, tensors), tiny)


def test_file_errors(adapter_dir, tiny, tmp_path):
    with pytest.raises(LoRALoadError, match=f"LoRA adapter '{tmp_path}/nowhere': no such directory"):
        load(tmp_path / "nowhere", tiny)
    with pytest.raises(LoRALoadError, match="no adapter_config.json in the directory"):
        load(tmp_path, tiny)
    path = variant(adapter_dir, tmp_path)
    (path / "adapter_config.json").write_text('{"r": 8,')
    with pytest.raises(LoRALoadError, match="adapter_config.json is not valid JSON"):
        load(path, tiny)
    (path / "adapter_config.json").write_text("[]")
    with pytest.raises(LoRALoadError, match="adapter_config.json is not a JSON object"):
        load(path, tiny)


def test_weight_file_errors(adapter_dir, tiny, tmp_path):
    path = variant(adapter_dir, tmp_path)
    weights = path / "adapter_model.safetensors"
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(LoRALoadError, match="adapter_model.safetensors cannot be read"):
        load(path, tiny)
    weights.unlink()
    with pytest.raises(LoRALoadError, match="no adapter weights in the directory "
                                            r"\(adapter_model.safetensors or adapter_model.bin\)"):
        load(path, tiny)
    torch.save({"x": datetime.date(2024, 1, 1)}, path / "adapter_model.bin")  # refused by weights_only
    with pytest.raises(LoRALoadError, match="adapter_model.bin cannot be read"):
        load(path, tiny)
    torch.save({"x": [1, 2]}, path / "adapter_model.bin")
    with pytest.raises(LoRALoadError, match="adapter_model.bin is not a mapping of tensor names to tensors"):
        load(path, tiny)


def test_smollm2_merged_model_delta(smollm2_dir, tmp_path):
    """On the default model: our per-shard B_scaled @ A is what the merged checkpoint (peft's
    merge_and_unload, as gdserve loads it) adds to each of our modules' weights."""
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    save_peft_adapter(hf, tmp_path / "adapter", r=8, alpha=16, use_rslora=True,
                      rank_pattern={"down_proj": 4}, seed=1)
    del hf
    merged = save_merged_model(smollm2_dir, tmp_path / "adapter", tmp_path / "merged")
    base, config = load_model(smollm2_dir)
    adapter = load(tmp_path / "adapter", base)
    assert adapter.rank == 8 and len(adapter.layers) == 4 * config.num_hidden_layers
    merged_weights = dict(load_model(merged)[0].named_parameters())
    for module, layer in adapter.layers.items():
        delta = merged_weights[f"{module}.weight"] - base.get_parameter(f"{module}.weight")
        ours = torch.cat([b @ a for a, b in zip(layer.lora_a, layer.lora_b, strict=True)])
        torch.testing.assert_close(ours, delta, atol=1e-6, rtol=1e-3, msg=module)
