"""LoRA in the engine on CUDA (CUDA graphs, the Triton LoRA kernels): greedy tokens with each adapter
against the engine on the model with that adapter merged (peft merge_and_unload), and a batch mixing
the base and three adapters against each request alone. float32, a random GQA Llama with a byte
tokenizer, adapters made with peft (carried as a wheel: make gpu-carry). Exit status 0 if all match.

    python3 scripts/lora_engine_gpu.py
"""
import gc
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:", "Water boils at"]
ADAPTERS = [dict(r=8, alpha=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj")),
            dict(r=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj")),
            dict(r=16, alpha=16, target_modules=("k_proj", "o_proj", "gate_proj"), use_rslora=True)]


def main() -> int:
    import torch
    if torch.cuda.is_available():  # the device machine: gdserve from the checkout, the carried wheels
        import gpu_common
        gpu_common.setup_imports()
    from transformers import LlamaConfig

    from gdserve import LLM, SamplingParams
    from gdserve.lora import LoRARequest
    from tests.helpers import (SMALL_LLAMA, save_byte_tokenizer, save_merged_model, save_peft_adapter,
                               save_random_hf_model)

    root = Path(tempfile.mkdtemp(prefix="lora-gpu-"))
    base_dir = root / "base"
    base = save_random_hf_model(LlamaConfig(**SMALL_LLAMA, architectures=["LlamaForCausalLM"]), base_dir)
    save_byte_tokenizer(base_dir)
    loras = []
    for i, spec in enumerate(ADAPTERS):
        save_peft_adapter(base, root / f"a{i}", seed=i + 1, **spec)
        save_merged_model(base_dir, root / f"a{i}", root / f"m{i}")
        loras.append(LoRARequest(f"a{i}", i + 1, str(root / f"a{i}")))
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    engine_args = dict(dtype="float32", gpu_memory_utilization=0.05)

    def tokens(outs) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in outs]

    expected = []
    for i in range(len(loras)):  # one engine at a time: each sizes its KV cache from what is free
        merged = LLM(str(root / f"m{i}"), **engine_args)
        expected.append(tokens(merged.generate(PROMPTS, params)))
        merged.engine.close()
        del merged
        gc.collect()
        torch.cuda.empty_cache()
    ok = True
    llm = LLM(str(base_dir), enable_lora=True, max_loras=4, max_lora_rank=16, **engine_args)
    if torch.cuda.is_available():
        assert llm.engine.runner.cuda_graphs is not None, "CUDA graphs are expected on"
    for i, lora in enumerate(loras):
        same = tokens(llm.generate(PROMPTS, params, lora_request=lora)) == expected[i]
        ok &= same
        print(f"adapter {i} vs merged: {'same' if same else 'DIFFERENT'}", flush=True)
    mixed_loras = [None, *loras]
    alone = [tokens(llm.generate(PROMPTS[i], params, lora_request=r))[0] for i, r in enumerate(mixed_loras)]
    mixed = tokens(llm.generate(PROMPTS, params, lora_request=mixed_loras))
    same = mixed == alone
    ok &= same
    print(f"mixed batch vs alone: {'same' if same else 'DIFFERENT'}", flush=True)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
