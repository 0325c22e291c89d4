"""Command-line flags for EngineConfig, shared by `gdserve serve`, `gdserve generate` and the benchmarks."""
import argparse

from gdserve.config import KV_CACHE_DTYPES
from gdserve.layers.quantization import QUANTIZATIONS


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="auto", help="auto | float32 | float16 | bfloat16")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES],
                        help="auto: the model's dtype; fp8 (e4m3) / fp8_e5m2: 8-bit K/V, scale 1.0")
    parser.add_argument("--fp8-attention", action="store_true",
                        help="with --kv-cache-dtype fp8: prefill attention's scores in fp8 (queries "
                             "quantized per row, queries and keys turned by a fixed rotation first; "
                             "P.V and decode keep exact dots over the cache)")
    parser.add_argument("--quantization", "-q", choices=QUANTIZATIONS,
                        help="fp8: linear layers in fp8 e4m3 (a scale per output channel), activations "
                             "quantized per token (W8A8; CUDA compute capability 8.9+, or CPU). awq | gptq | "
                             "gguf: the checkpoint's quantized linear layers stay packed (awq and gptq are "
                             "also found in config.json; gguf needs a .gguf model)")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int,
                        help="sequences in the running batch (default: sized from the KV cache, 256 to 1024)")
    parser.add_argument("--max-num-batched-tokens", type=int, help="tokens per step (default: 8192 on CUDA, 2048 on CPU)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-cache-memory", type=int, default=1 << 30, help="KV cache bytes (CPU)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--num-gpu-blocks-override", type=int,
                        help="KV cache blocks, instead of what the memory flags give (tests, preemption benches)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--preemption-mode", choices=["recompute", "swap"],
                        help="what preemption does with a sequence's KV blocks: drop them and prefill again "
                             "(recompute, the default) or copy them to CPU memory and back (swap)")
    parser.add_argument("--swap-space", type=float, default=4,
                        help="CPU memory in GiB for swapped-out KV blocks (with --preemption-mode swap)")
    parser.add_argument("--schedule-conservativeness", type=float, default=1.0,
                        help="KV blocks kept free for running sequences' expected growth, as a multiple of "
                             "the share of max_tokens recent requests generated (0: none; admit while the "
                             "prompt fits and preempt when sequences outgrow the cache)")
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    parser.add_argument("--grammar-compile-timeout-s", type=float, default=10.0)
    parser.add_argument("--grammar-compile-workers", type=int,
                        help="processes compiling constraints, started with the engine (default: the usable "
                             "CPU cores less one, at most 8)")
    parser.add_argument("--grammar-mask-workers", type=int,
                        help="processes holding the guided sequences' matchers, so that a step's rows are computed "
                             "on that many cores at once (default: on a GPU the usable CPU cores less two, at most 16; "
                             "on the CPU 0, the engine's thread)")
    parser.add_argument("--grammar-cache-dir", default="auto",
                        help="compiled grammars persist here across restarts (default: $GDSERVE_CACHE/grammars; "
                             "'none' turns it off)")
    parser.add_argument("--enable-forced-tokens", action=argparse.BooleanOptionalAction, default=None,
                        help="guided sequences take the text their constraint forces without a decode step "
                             "per token (the next step prefills it as a chunk; default: on the CPU)")
    parser.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs for decode steps")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                        help="read sampled tokens back during the next step's forward (default: on CUDA)")
    parser.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters over the base model")
    parser.add_argument("--max-loras", type=int, default=1, help="adapters one batch may mix (GPU slots)")
    parser.add_argument("--max-lora-rank", type=int, default=16, help="the largest adapter rank served")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                        help="split the model across this many ranks, one process each (cuda:0..N-1 on CUDA)")
    parser.add_argument("--max-cpu-loras", type=int,
                        help="adapters kept read in CPU memory, least recently used out first (default: --max-loras)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineConfig / LLM(...) keyword arguments of the flags add_engine_args added."""
    return dict(dtype=args.dtype, device=args.device, kv_cache_dtype=args.kv_cache_dtype,
                fp8_attention=args.fp8_attention,
                quantization=args.quantization,
                max_model_len=args.max_model_len,
                max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                block_size=args.block_size, kv_cache_memory=args.kv_cache_memory,
                gpu_memory_utilization=args.gpu_memory_utilization,
                num_gpu_blocks_override=args.num_gpu_blocks_override,
                enable_prefix_caching=args.enable_prefix_caching, load_format=args.load_format,
                preemption_mode=args.preemption_mode, swap_space=args.swap_space,
                schedule_conservativeness=args.schedule_conservativeness,
                grammar_compile_timeout_s=args.grammar_compile_timeout_s,
                grammar_compile_workers=args.grammar_compile_workers,
                grammar_mask_workers=args.grammar_mask_workers, enforce_eager=args.enforce_eager,
                grammar_cache_dir=None if args.grammar_cache_dir == "none" else args.grammar_cache_dir,
                enable_forced_tokens=args.enable_forced_tokens,
                async_scheduling=args.async_scheduling, enable_lora=args.enable_lora, max_loras=args.max_loras,
                max_lora_rank=args.max_lora_rank, max_cpu_loras=args.max_cpu_loras,
                tensor_parallel_size=args.tensor_parallel_size)
