"""Swap preemption on CUDA (pinned CPU memory, asynchronous copies, CUDA graphs, async scheduling):
a random GQA Llama with a byte tokenizer, a KV cache of a few blocks (num_gpu_blocks_override):
- float32: the greedy tokens of swap and of recompute equal an unpreempted run's;
- fp8 KV cache: blocks swapped out and back in keep every byte (the greedy tokens are printed, not
  compared: other batch shapes round other values to fp8, so any two runs may part ways);
- every block back in its pool at the end. Exit status 0 if all pass.

    python3 scripts/swap_gpu.py
"""
import gc
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch
    if torch.cuda.is_available():  # the device machine: gdserve from the checkout, the carried wheels
        import gpu_common
        gpu_common.setup_imports()
    from transformers import LlamaConfig

    from gdserve import LLM, SamplingParams
    from tests.helpers import SMALL_LLAMA, save_byte_tokenizer, save_random_hf_model

    model_dir = Path(tempfile.mkdtemp(prefix="swap-gpu-")) / "m"
    save_random_hf_model(LlamaConfig(**SMALL_LLAMA, architectures=["LlamaForCausalLM"]), model_dir)
    save_byte_tokenizer(model_dir)
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 259) for _ in range(rng.randint(8, 120))]} for _ in range(24)]
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    ok = True
    for kv_cache_dtype in ("auto", "fp8"):
        runs = {}
        for mode, blocks in (("roomy", None), ("recompute", 24), ("swap", 24)):
            llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype=kv_cache_dtype, block_size=16,
                      gpu_memory_utilization=0.05, num_gpu_blocks_override=blocks,
                      preemption_mode=None if mode == "roomy" else mode, swap_space=0.01,
                      schedule_conservativeness=0)  # no growth reserve: the tight runs preempt
            runs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            engine = llm.engine
            kv = engine.kv_cache
            leaks = (kv.num_free_blocks != kv.num_blocks or kv.swap_space.num_free_blocks != kv.swap_space.num_blocks
                     or engine.has_unfinished_requests())
            print(f"kv {kv_cache_dtype:5s} {mode:9s}: {engine.scheduler.num_preemptions:3d} preemptions, "
                  f"{engine.scheduler.num_swap_outs:3d} swapped, graphs={engine.runner.cuda_graphs is not None}, "
                  f"leaks={leaks}")
            ok &= not leaks and (mode == "roomy") == (engine.scheduler.num_preemptions == 0)
            engine.close()
            del llm, engine, kv
            gc.collect()
            torch.cuda.empty_cache()
        for mode in ("recompute", "swap"):
            same = sum(a == b for a, b in zip(runs[mode], runs["roomy"]))
            print(f"kv {kv_cache_dtype:5s} {mode:9s}: {same} of {len(prompts)} outputs equal the unpreempted run's")
            ok &= kv_cache_dtype == "fp8" or same == len(prompts)
        ok &= bytes_round_trip(LLM(str(model_dir), dtype="bfloat16", kv_cache_dtype=kv_cache_dtype,
                                   num_gpu_blocks_override=64, preemption_mode="swap", swap_space=0.01))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def bytes_round_trip(llm) -> bool:
    """Random bytes in scattered device blocks, out to CPU blocks and back to other device blocks."""
    import torch
    runner = llm.engine.runner
    cache = runner.kv_cache.view(torch.uint8)
    cache.copy_(torch.randint(0, 256, cache.shape, dtype=torch.uint8, device=cache.device))
    sources, cpu_blocks, targets = [3, 17, 5, 30, 8, 9, 22], [0, 1, 2, 3, 4, 10, 11], list(range(40, 47))
    before = cache[:, :, sources].clone()
    runner.swap_out(list(zip(sources, cpu_blocks)))
    runner.swap_in(list(zip(cpu_blocks, targets)))
    same = torch.equal(cache[:, :, targets], before)
    print(f"{runner.kv_cache.dtype} blocks out and back in, byte for byte: {same}")
    llm.engine.close()
    return same


if __name__ == "__main__":
    sys.exit(main())
