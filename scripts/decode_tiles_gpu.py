"""Device experiment: decode attention tiles beyond test_gpu.py's sweep (1-2 warps), for the bf16
and the fp8 cache, then the engine's random_workload() run with the best bf16 tile against the
default, in one process. Usage: python3 scripts/decode_tiles_gpu.py [NUM_LAYERS] (GDSERVE_SHARED
as for bench_gpu.py; prints JSON lines)."""
import functools
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_gpu  # noqa: E402


def sweep(kv_dtype) -> list[dict]:
    import torch
    from gdserve.kernels.paged_attention import decode_attention_reference
    from gdserve.kernels.triton.paged_attention import decode_attention_triton
    q, k_cache, v_cache, tables, lens, kv_bytes = test_gpu.decode_case(256, 1024, kv_dtype=kv_dtype)
    scale = 128 ** -0.5
    ref = decode_attention_reference(q, k_cache, v_cache, tables, lens, [1024] * 256, scale)
    kernel = lambda **tile: decode_attention_triton(q, k_cache, v_cache, tables, lens, 1024, scale, **tile)
    rows = test_gpu.sweep_tiles(kernel, ref, kv_bytes, (32, 64, 128), (1, 2, 4), (2, 3, 4))
    del q, k_cache, v_cache
    torch.cuda.empty_cache()
    return sorted(rows, key=lambda r: r["ms"])


def main() -> None:
    test_gpu.setup_imports()
    import torch
    from gdserve.bench.throughput import run_engine
    from gdserve.bench.workloads import load_workload_module
    import gdserve.kernels.triton.paged_attention as pa
    num_layers = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    for name, dtype in (("bf16", None), ("fp8", torch.float8_e4m3fn)):
        rows = sweep(dtype)
        print(json.dumps({"sweep": name, "best": rows[:6]}), flush=True)
        if name == "bf16":
            best = {k: rows[0][k] for k in ("block_n", "num_warps", "num_stages")}
    requests = load_workload_module().random_workload(n=256)
    default = pa.decode_attention_triton
    with tempfile.TemporaryDirectory() as tmp:
        test_gpu.save_model_dir(Path(tmp), num_layers, test_gpu.tokenizer_arg([]))
        for label, fn in (("default", default), ("best", functools.partial(default, **best)), ("default", default)):
            pa.decode_attention_triton = fn
            run = run_engine(requests, tmp, {"load_format": "dummy", "dtype": "bfloat16"})
            print(json.dumps({"engine": label, "tile": None if fn is default else best, **run}), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
