"""`gdserve bench throughput --lora N` on the tiny model: the random adapters it writes load in the
engine and change its output, and the CLI run writes the base and LoRA figures and their ratio."""
import json

import pytest
import torch
from safetensors.torch import load_file

from gdserve import LLM, SamplingParams
from gdserve.bench.random_adapters import PROJECTIONS, write_random_adapter, write_random_adapters
from gdserve.entrypoints.cli import main
from gdserve.lora import LoRARequest
from tests.bench.conftest import ENGINE_FLAGS, assert_refused
from tests.helpers import TINY_LLAMA

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [(5 * i + j) % 250 + 3 for j in range(6 + i)]} for i in range(4)]


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_adapters_have_the_model_shapes_and_change_its_output(tiny_llama_dir, tmp_path):
    paths = write_random_adapters(tmp_path, tiny_llama_dir, 2, rank=8, dtype=torch.float32)
    weights = load_file(paths[0] / "adapter_model.safetensors")
    hidden, inter = TINY_LLAMA["hidden_size"], TINY_LLAMA["intermediate_size"]
    kv = hidden // TINY_LLAMA["num_attention_heads"] * TINY_LLAMA["num_key_value_heads"]
    layer0 = "base_model.model.model.layers.0"
    assert len(weights) == 2 * len(PROJECTIONS) * TINY_LLAMA["num_hidden_layers"]
    assert weights[f"{layer0}.self_attn.k_proj.lora_A.weight"].shape == (8, hidden)
    assert weights[f"{layer0}.self_attn.k_proj.lora_B.weight"].shape == (kv, 8)
    assert weights[f"{layer0}.mlp.down_proj.lora_A.weight"].shape == (8, inter)
    assert all(w.count_nonzero() == w.numel() for w in weights.values())
    config = json.loads((paths[0] / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["target_modules"]) == ("LORA", 8, list(PROJECTIONS))

    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22, enable_lora=True, max_loras=2,
              max_lora_rank=8)
    base = tokens(llm.generate(PROMPTS, GREEDY))
    with_adapters = [tokens(llm.generate(PROMPTS, GREEDY, lora_request=LoRARequest(f"a{i}", i + 1, str(p))))
                     for i, p in enumerate(paths)]
    assert base != with_adapters[0] != with_adapters[1] != base


def test_targets_and_rank_are_the_ones_asked_for(tiny_llama_dir, tmp_path):
    path = write_random_adapter(tmp_path / "qv", tiny_llama_dir, rank=4, targets=("q_proj", "v_proj"))
    weights = load_file(path / "adapter_model.safetensors")
    assert {k.split(".")[-3] for k in weights} == {"q_proj", "v_proj"}
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    assert {w.shape[0] for k, w in weights.items() if "lora_A" in k} == {4}


def test_peft_reads_the_adapter_as_written(tiny_llama_dir, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM
    path = write_random_adapter(tmp_path / "a", tiny_llama_dir, rank=4, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    loaded = {k.replace(".default", ""): v for k, v in peft.PeftModel.from_pretrained(base, str(path)).state_dict().items()
              if ".lora_" in k}
    written = load_file(path / "adapter_model.safetensors")
    assert loaded.keys() == written.keys()
    assert all(torch.equal(loaded[k], written[k]) for k in written)


def test_cli_writes_base_and_lora_figures_and_their_ratio(tiny_llama_dir, tiny_workload, tmp_path, capsys):
    output = tmp_path / "lora.json"
    main(["bench", "throughput", str(tiny_llama_dir), "--lora", "2", "--lora-rank", "8", "--num-requests", "4",
          "--output", str(output), *ENGINE_FLAGS])
    r = json.loads(output.read_text())
    assert {"command", "date", "commit", "machine", "device"} <= set(r)
    assert r["adapters"] == {"num_adapters": 2, "rank": 8, "targets": list(PROJECTIONS), "dtype": "torch.float32"}
    expected = sum(3 + i for i in range(4))  # EOS ignored: every request runs to its max_tokens
    assert r["base"]["output_tokens"] == r["lora"]["output_tokens"] == expected
    assert r["ratio"] == pytest.approx(r["lora"]["tokens_per_s"] / r["base"]["tokens_per_s"])
    assert "hf" not in r
    assert "ratio lora / base" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--lora-rank", "8"], "--lora-rank need --lora N"),
    (["--lora", "2", "--workload", "cpu-guided"], "--lora runs on --workload cpu or random"),
    (["--lora", "0"], "--lora must be >= 1"),
    (["--lora", "2", "--lora-rank", "0"], "--lora-rank must be >= 1"),
    (["--lora", "2", "--lora-targets", "q_proj,qkv_proj"], "LoRA targets: unknown projection(s) qkv_proj"),
    (["--lora", "2", "--max-loras", "3"], "--max-loras 3 conflicts with --lora 2"),
])
def test_bad_flags_are_refused_before_loading(flags, message, capsys):
    assert_refused("throughput", flags, message, capsys)
