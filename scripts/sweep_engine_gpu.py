"""Device diagnostic: `random_workload()` n=256 on the engine (CUDA graphs) once per value of one
engine argument, in one process, to compare defaults side by side.
Usage: python3 scripts/sweep_engine_gpu.py [NUM_LAYERS] NAME=V1,V2,... [--tokenizer=DIR|byte-pair]
(e.g. max_num_batched_tokens=8192,16384; integer values; repeat a value to interleave runs. NAME
`blas` sets torch's preferred BLAS library instead, e.g. blas=cublas,cublaslt. GDSERVE_SHARED and
the tokenizer as for bench_gpu.py; writes sweep_engine.json under $OUT, each run under its position
and value)"""
import gc
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
    from gdserve.bench.throughput import run_engine
    from gdserve.bench.workloads import load_workload_module
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    num_layers = int(args[0]) if args and "=" not in args[0] else 32
    name, values = next(a for a in args if "=" in a).split("=", 1)
    requests = load_workload_module().random_workload(n=256)
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    result = {"workload": "random_workload(n=256)", "model": f"Llama-3-8B shape, {num_layers} layers",
              "device": torch.cuda.get_device_name(), "argument": name, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        test_gpu.save_model_dir(Path(tmp), num_layers, test_gpu.tokenizer_arg(sys.argv[1:]))
        for i, value in enumerate(values.split(",")):
            engine_args = {"load_format": "dummy", "dtype": "bfloat16"}
            if name == "blas":
                torch.backends.cuda.preferred_blas_library(value)
            else:
                engine_args[name] = int(value)
            run = run_engine(requests, tmp, engine_args)
            result["runs"][f"{i}:{value}"] = run
            print(f"{name}={value}", json.dumps(run), flush=True)
            (out / "sweep_engine.json").write_text(json.dumps(result, indent=1))
            gc.collect()  # the finished run's engine (its KV cache is most of the device)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
