"""Device experiment (issue 6): can a mixed step's decode attention run under its prefill GEMMs?

One Llama-3-8B layer in bf16, a mixed step of P prefill rows and D decode rows at context L:
- joint: the layer's four GEMMs (qkv, o, gate_up, down) over all P + D rows, then decode attention
  (what the engine does now, prefill attention left out of both sides);
- split: the GEMMs of the P rows and of the D rows apart (what overlapping needs: the decode rows'
  o_proj and MLP wait for their attention), then decode attention;
- overlapped: the P rows' GEMMs on one stream while decode attention and then the D rows' GEMMs run
  on a second (NanoFlow-style).
Overlapping pays where overlapped < joint. Usage: python3 scripts/overlap_gpu.py (writes
$OUT/overlap.json)."""
import importlib.util
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT") or ROOT / "gpu-results")
SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


def load_test_gpu():
    spec = importlib.util.spec_from_file_location("test_gpu", ROOT / "scripts" / "test_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    test_gpu = load_test_gpu()
    test_gpu.OUT = OUT
    test_gpu.setup_imports()
    from gdserve.kernels.triton.paged_attention import decode_attention_triton
    weights = {n: torch.randn(out, inp, device="cuda", dtype=torch.bfloat16) * 0.02 for n, (inp, out) in SHAPES.items()}

    def layer(x: dict):
        for name, w in weights.items():
            F.linear(x[name], w)

    def rows(m: int) -> dict:
        return {n: torch.randn(m, inp, device="cuda", dtype=torch.bfloat16) for n, (inp, _) in SHAPES.items()}

    results = []
    side = torch.cuda.Stream()
    for prefill, decode, context in ((1024, 256, 1024), (4096, 256, 1024), (7936, 256, 1024),
                                     (4096, 128, 1024), (7936, 64, 512)):
        q, k_cache, v_cache, tables, lens, kv_bytes = test_gpu.decode_case(decode, context)
        scale = 128 ** -0.5
        both, p_rows, d_rows = rows(prefill + decode), rows(prefill), rows(decode)

        def attention():
            decode_attention_triton(q, k_cache, v_cache, tables, lens, context, scale)

        def joint():
            layer(both)
            attention()

        def split():
            layer(p_rows)
            layer(d_rows)
            attention()

        def overlapped():
            main_stream = torch.cuda.current_stream()
            side.wait_stream(main_stream)
            with torch.cuda.stream(side):
                attention()
                layer(d_rows)
            layer(p_rows)
            main_stream.wait_stream(side)

        t = {name: test_gpu.median_ms(fn) for name, fn in
             (("joint", joint), ("split", split), ("overlapped", overlapped), ("attention", attention),
              ("gemms_joint", lambda: layer(both)), ("gemms_prefill_rows", lambda: layer(p_rows)),
              ("gemms_decode_rows", lambda: layer(d_rows)))}
        row = {"prefill_rows": prefill, "decode_rows": decode, "context": context,
               **{f"{k}_ms": round(v, 4) for k, v in t.items()},
               "attention_gbs": round(kv_bytes / t["attention"] / 1e6, 1),
               "overlapped_vs_joint": round(t["overlapped"] / t["joint"], 3)}
        print(row, flush=True)
        results.append(row)
    (OUT / "overlap.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "layers": results},
                                                 indent=1))


if __name__ == "__main__":
    main()
