"""The device's draw at the batch sizes the engine runs: gumbel_argmax (one pass, the Triton
kernel) against the same draw in torch ops (exponential noise, its log, a subtraction and an
argmax: the passes the one-pass kernel replaces) and against a bare argmax (one read of the
logits: the floor), over float32 logits of Llama-3's vocabulary. Writes sampler_gpu.json under $OUT.
Usage: python3 scripts/sampler_gpu.py"""
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_common  # noqa: E402

VOCAB = 128_256
BATCHES = (1, 64, 256, 1024)


def timed_ms(fn, iters: int = 20) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def torch_race(logits, temperature):
    import torch
    noise = torch.empty_like(logits).exponential_().clamp_min_(torch.finfo(torch.float32).tiny)
    return logits.div(temperature.unsqueeze(1)).sub_(noise.log_()).argmax(dim=-1)


def main() -> None:
    gpu_common.setup_imports()
    import torch
    from gdserve.kernels.sampling import gumbel_argmax
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for batch in BATCHES:
        logits = torch.randn(batch, VOCAB, device="cuda") * 3
        temperature = torch.full((batch,), 0.8, device="cuda")
        seeds = torch.randint(0, 2**62, (batch,), device="cuda")
        row = {"batch": batch, "vocab": VOCAB,
               "gumbel_argmax_ms": timed_ms(lambda: gumbel_argmax(logits, temperature, seeds)),
               "torch_race_ms": timed_ms(lambda: torch_race(logits, temperature)),
               "argmax_ms": timed_ms(lambda: logits.argmax(dim=-1))}
        row["speedup"] = row["torch_race_ms"] / row["gumbel_argmax_ms"]
        row["gumbel_over_argmax"] = row["gumbel_argmax_ms"] / row["argmax_ms"]
        rows.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
        print(json.dumps(rows[-1]), flush=True)
    result = {"device": torch.cuda.get_device_name(), "dtype": "float32", "rows": rows}
    (out / "sampler_gpu.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
