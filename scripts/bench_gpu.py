"""`gdserve bench throughput` on the GPU machine, without the CLI (whose other subcommands import
the server's dependencies, absent from the GPU image), in one run: random_workload() n=256 on the
engine (CUDA graphs, then --enforce-eager) and on HF `generate` (static batches of 128), and
guided_workload() n=256 guided against the same work unguided. Llama-3-8B shape, bf16, random
weights on both sides.
Usage: python3 scripts/bench_gpu.py [NUM_LAYERS] [--skip-hf] [--guided-only] [--fp8-kv] [--fp8-weights]
[--tokenizer=DIR|byte-pair] [--guided-n=N] [--guided-fp8] (writes bench_gpu.json under $OUT;
--guided-only: the guided against unguided run alone; --guided-n: its request count (256);
--guided-fp8: that run with fp8 weights and KV cache; --fp8-kv: the engine again with an fp8 KV cache, after the bf16 one;
--fp8-weights: the engine again with `quantization="fp8"` (W8A8), with the bf16 and then the fp8
KV cache, then bf16 and fp8 weights once more; the tokenizer: SmolLM2's, saved to
build/tokenizer by `make gpu-carry`, by default)"""
import gc
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_common  # noqa: E402  (makes gdserve importable and installs the carried wheels)


def main() -> None:
    gpu_common.setup_imports()
    import torch
    from gdserve.bench.throughput import run_engine, run_guided_vs_unguided, run_hf
    from gdserve.bench.workloads import guided_workload, random_workload
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    guided_only = "--guided-only" in sys.argv
    num_layers = int(args[0]) if args else 32
    tokenizer = gpu_common.tokenizer_arg(sys.argv[1:])
    requests = random_workload(n=256)
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    result = {"workload": "random_workload(n=256)", "model": f"Llama-3-8B shape, {num_layers} layers, vocab 49152",
              "dtype": "bfloat16", "device": torch.cuda.get_device_name(),
              "tokenizer": "synthetic byte pairs" if tokenizer is None else str(tokenizer)}
    engine_args = {"load_format": "dummy", "dtype": "bfloat16"}

    def record(key: str, value: dict) -> None:
        result[key] = value
        print(key, json.dumps(value), flush=True)
        (out / "bench_gpu.json").write_text(json.dumps(result, indent=1))
        gc.collect()  # the finished run's engine (its KV cache is most of the device)
        torch.cuda.empty_cache()

    with tempfile.TemporaryDirectory() as tmp:
        gpu_common.save_model_dir(Path(tmp), num_layers, tokenizer)
        if not guided_only:
            record("engine", run_engine(requests, tmp, engine_args))
            if "--fp8-kv" in sys.argv:
                record("engine_fp8_kv", run_engine(requests, tmp, {**engine_args, "kv_cache_dtype": "fp8"}))
                result["fp8_kv_over_bf16"] = result["engine_fp8_kv"]["tokens_per_s"] / result["engine"]["tokens_per_s"]
            if "--fp8-weights" in sys.argv:
                fp8 = {**engine_args, "quantization": "fp8"}
                record("engine_fp8_weights", run_engine(requests, tmp, fp8))
                record("engine_fp8_weights_fp8_kv", run_engine(requests, tmp, {**fp8, "kv_cache_dtype": "fp8"}))
                record("engine_again", run_engine(requests, tmp, engine_args))  # the drift between runs
                record("engine_fp8_weights_again", run_engine(requests, tmp, fp8))
                for key in ("engine_fp8_weights", "engine_fp8_weights_fp8_kv"):
                    result[f"{key}_over_bf16"] = result[key]["tokens_per_s"] / result["engine"]["tokens_per_s"]
            record("engine_eager", run_engine(requests, tmp, {**engine_args, "enforce_eager": True}))
        guided_n = int(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--guided-n=")), 256))
        guided_args = ({**engine_args, "quantization": "fp8", "kv_cache_dtype": "fp8"}
                       if "--guided-fp8" in sys.argv else engine_args)
        result["guided_workload"] = f"guided_workload(n={guided_n})"
        result["guided_engine_args"] = guided_args
        record("guided", run_guided_vs_unguided(guided_workload(n=guided_n), tmp, guided_args))
        if "--skip-hf" not in sys.argv and not guided_only:
            record("hf", run_hf(requests, Path(tmp), torch.bfloat16, torch.device("cuda"), 128, dummy=True))
            result["ratio"] = result["engine"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
    if not guided_only:
        result["graphs_over_eager"] = result["engine"]["tokens_per_s"] / result["engine_eager"]["tokens_per_s"]
        print(f"ratio engine / hf: {result.get('ratio', 0):.2f}x; CUDA graphs / eager "
              f"{result['graphs_over_eager']:.2f}x", flush=True)
    print(f"guided / unguided {result['guided']['ratio']:.2f}x", flush=True)
    (out / "bench_gpu.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
