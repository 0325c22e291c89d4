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
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import test_gpu  # noqa: E402  (makes gdserve importable and installs the carried wheels)


def run_each(runs: Iterable[tuple[str, list[dict], Callable[[], dict]]], num_layers: int, result: dict,
             file_name: str) -> None:
    """Runs (label, requests, engine args) one after the other in this process on one random-weight
    model dir; result["runs"][label] gets each figure, and result is rewritten under $OUT after
    each run. The engine args come from a callable so that it can also set process-wide state."""
    import torch
    from gdserve.bench.throughput import run_engine
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    result.update(model=f"Llama-3-8B shape, {num_layers} layers", device=torch.cuda.get_device_name(), runs={})
    with tempfile.TemporaryDirectory() as tmp:
        test_gpu.save_model_dir(Path(tmp), num_layers, test_gpu.tokenizer_arg(sys.argv[1:]))
        for label, requests, engine_args in runs:
            run = run_engine(requests, tmp, {"load_format": "dummy", "dtype": "bfloat16", **engine_args()})
            result["runs"][label] = run
            print(label, json.dumps(run), flush=True)
            (out / file_name).write_text(json.dumps(result, indent=1))
            gc.collect()  # the finished run's engine (its KV cache is most of the device)
            torch.cuda.empty_cache()


def main() -> None:
    test_gpu.setup_imports()
    import torch
    from gdserve.bench.workloads import load_workload_module
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    num_layers = int(args[0]) if args and "=" not in args[0] else 32
    name, values = next(a for a in args if "=" in a).split("=", 1)
    requests = load_workload_module().random_workload(n=256)

    def engine_args(value: str) -> Callable[[], dict]:
        def args() -> dict:
            if name != "blas":
                return {name: int(value)}
            torch.backends.cuda.preferred_blas_library(value)
            return {}
        return args

    runs = [(f"{i}:{value}", requests, engine_args(value)) for i, value in enumerate(values.split(","))]
    run_each(runs, num_layers, {"workload": "random_workload(n=256)", "argument": name}, "sweep_engine.json")


if __name__ == "__main__":
    main()
