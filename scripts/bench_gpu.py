"""`gdserve bench throughput` on the GPU machine, without the CLI (whose other subcommands import
the server's dependencies, absent from the GPU image): random_workload() n=256 on the engine and on
HF `generate` (static batches of 128), Llama-3-8B shape, bf16, random weights on both sides.
Needs the standard workloads: GDSERVE_SHARED=<folder holding bench/workload.py>.
Usage: python3 scripts/bench_gpu.py [NUM_LAYERS]   (writes bench_gpu.json under $OUT)"""
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import test_gpu  # noqa: E402  (makes gdserve importable and installs the carried wheels)


def main() -> None:
    test_gpu.setup_imports()
    import torch
    from gdserve.bench.throughput import run_engine, run_hf
    from gdserve.bench.workloads import load_workload_module
    num_layers = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    requests = load_workload_module().random_workload(n=256)
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    result = {"workload": "random_workload(n=256)", "model": f"Llama-3-8B shape, {num_layers} layers, vocab 49152",
              "dtype": "bfloat16", "device": torch.cuda.get_device_name()}
    with tempfile.TemporaryDirectory() as tmp:
        test_gpu.save_model_dir(Path(tmp), num_layers)
        result["engine"] = run_engine(requests, tmp, {"load_format": "dummy", "dtype": "bfloat16"})
        print("engine", json.dumps(result["engine"]), flush=True)
        (out / "bench_gpu.json").write_text(json.dumps(result, indent=1))
        torch.cuda.empty_cache()
        result["hf"] = run_hf(requests, Path(tmp), torch.bfloat16, torch.device("cuda"), 128, dummy=True)
        print("hf", json.dumps(result["hf"]), flush=True)
    result["ratio"] = result["engine"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
    print(f"ratio engine / hf: {result['ratio']:.2f}x", flush=True)
    (out / "bench_gpu.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
