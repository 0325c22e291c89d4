"""Tensor parallelism at real shapes: Llama-3-8B's shape (fewer layers), random weights saved as
safetensors so that every rank loads the same tensors (dummy weights are drawn per rank), and the
greedy tokens of TP=N against TP=1 on the same prompts: float32 token for token; bf16 within the
single-GPU check's tolerance (the same tokens for 95% of the prompts, else every first-token
logprob within 0.1). Needs N CUDA devices; `--device cpu` runs the same check on the CPU (gloo), a
smoke test at a small vocabulary.
Usage: python3 scripts/tensor_parallel_gpu.py [--tp 2] [--layers 4] [--vocab 49152] [--device cuda]
(writes tensor_parallel_gpu.json under $OUT; exit status 0 only if every check passes)."""
import argparse
import gc
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_common  # noqa: E402

STEPS = 32
LOGPROB_TOLERANCE = 0.1  # gpu_checks.engine_check's


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=gpu_common.LLAMA3_8B["vocab_size"])
    p.add_argument("--device", default="cuda")
    return p.parse_args()


def save_random_checkpoint(path: Path, layers: int, vocab: int, device: str) -> None:
    """config.json, a synthetic tokenizer and random bf16 weights (norms near 1) in HF's names."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig
    config = LlamaConfig(**{**gpu_common.LLAMA3_8B, "vocab_size": vocab, "tie_word_embeddings": False},
                         num_hidden_layers=layers, torch_dtype="bfloat16")
    config.save_pretrained(path)
    gpu_common.save_byte_pair_tokenizer(path, vocab)
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        prefix = f"model.layers.{i}."
        shapes.update({prefix + "input_layernorm.weight": (hidden,),
                       prefix + "post_attention_layernorm.weight": (hidden,),
                       prefix + "self_attn.q_proj.weight": (hidden, hidden),
                       prefix + "self_attn.k_proj.weight": (kv, hidden),
                       prefix + "self_attn.v_proj.weight": (kv, hidden),
                       prefix + "self_attn.o_proj.weight": (hidden, hidden),
                       prefix + "mlp.gate_proj.weight": (inter, hidden),
                       prefix + "mlp.up_proj.weight": (inter, hidden),
                       prefix + "mlp.down_proj.weight": (hidden, inter)})
    generator = torch.Generator(device=device).manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        values = torch.randn(shape, generator=generator, device=device)
        values = 1.0 + 0.1 * values if name.endswith("norm.weight") else 0.02 * values
        tensors[name] = values.to(torch.bfloat16).cpu()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def greedy(model_dir: Path, prompts: list[list[int]], dtype: str, tp: int, device: str) -> tuple[list, list]:
    """Greedy tokens and first-token logprobs of an engine with tp ranks, then the engine let go."""
    import torch
    from gdserve import LLM, SamplingParams
    extra = {"gpu_memory_utilization": 0.5} if device == "cuda" else {}
    llm = LLM(str(model_dir), dtype=dtype, device=device, tensor_parallel_size=tp, **extra)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True, logprobs=0),
                        use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    logprobs = [gpu_common.first_logprob(o.outputs[0]) for o in outs]
    llm.engine.close()
    del llm, outs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return tokens, logprobs


def compare(one: tuple[list, list], many: tuple[list, list], dtype: str) -> dict:
    (tokens_1, lps_1), (tokens_n, lps_n) = one, many
    identical = sum(a == b for a, b in zip(tokens_1, tokens_n)) / len(tokens_1)
    lp_err = max(abs(a - b) for a, b in zip(lps_1, lps_n))
    passed = identical == 1.0 if dtype == "float32" else (identical >= 0.95 or lp_err <= LOGPROB_TOLERANCE)
    return {"dtype": dtype, "identical_fraction": identical, "first_token_logprob_abs_err_max": lp_err,
            "passed": passed}


def main() -> int:
    args = parse_args()
    if args.device == "cuda":  # the device image; on the CPU the development install serves
        gpu_common.setup_imports()
    import torch
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} CUDA devices; {torch.cuda.device_count()} are visible")
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    prompts = gpu_common.make_prompts(n=8, vocab=args.vocab)
    result = {"model": f"Llama-3-8B shape, {args.layers} layers, vocab {args.vocab}, random bf16 weights",
              "tp": args.tp, "device": args.device, "prompts": len(prompts), "tokens_each": STEPS, "checks": []}
    with tempfile.TemporaryDirectory() as tmp:
        save_random_checkpoint(Path(tmp), args.layers, args.vocab, args.device)
        for dtype in ("float32", "bfloat16"):
            one = greedy(Path(tmp), prompts, dtype, 1, args.device)
            many = greedy(Path(tmp), prompts, dtype, args.tp, args.device)
            result["checks"].append(compare(one, many, dtype))
            print(json.dumps(result["checks"][-1]), flush=True)
    result["passed"] = all(c["passed"] for c in result["checks"])
    (out / "tensor_parallel_gpu.json").write_text(json.dumps(result, indent=1))
    print("PASS" if result["passed"] else "FAIL", flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
