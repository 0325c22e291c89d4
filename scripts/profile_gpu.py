"""Device diagnostic: where a step's time goes on random_workload(n=256) (Llama-3-8B shape, bf16,
random weights). Steps the engine by hand, timing each step on the host and classifying it (decode
only / with prefill chunks), and runs torch.profiler over a few decode steps and a few mixed ones:
device time per kernel against host time per step.
Usage: python3 scripts/profile_gpu.py [NUM_LAYERS [MAX_NUM_BATCHED_TOKENS]]
(writes profile_gpu.json and profile_gpu.txt under $OUT)."""
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_common  # noqa: E402


def main() -> None:
    gpu_common.setup_imports()
    import torch
    from torch.profiler import ProfilerActivity, profile
    from gdserve import LLM, SamplingParams
    from gdserve.bench.workloads import random_workload
    num_layers = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    max_num_batched_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else None
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    requests = random_workload(n=256)
    with tempfile.TemporaryDirectory() as tmp:
        gpu_common.save_model_dir(Path(tmp), num_layers)
        llm = LLM(tmp, load_format="dummy", dtype="bfloat16", max_num_batched_tokens=max_num_batched_tokens)
        max_num_batched_tokens = llm.engine.config.max_num_batched_tokens
    engine = llm.engine
    llm.generate([{"prompt_token_ids": requests[0]["prompt_ids"]}], SamplingParams(max_tokens=4))
    for r in requests:
        engine.add_request(r["prompt_ids"], SamplingParams(max_tokens=r["max_tokens"], temperature=0.0,
                                                           ignore_eos=True, output_kind="final_only"))
    from gdserve.engine.sampler import HostSamplerOutput
    waited = [0.0]  # seconds the host spent waiting for the device's sampled tokens
    wait = HostSamplerOutput.wait

    def timed_wait(self):
        t = time.perf_counter()
        torch.cuda.current_stream().synchronize() if self.ready is None else self.ready.synchronize()
        waited[0] += time.perf_counter() - t
        return wait(self)
    HostSamplerOutput.wait = timed_wait
    syncs: dict[str, int] = {}  # stack -> count of synchronizing CUDA calls (sync debug mode)

    def on_warning(message, category, filename, lineno, file=None, line=None):
        stack = "".join(traceback.format_stack(limit=14)[:-2])
        syncs[stack] = syncs.get(stack, 0) + 1
    warnings.showwarning = on_warning
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    steps, tokens = [], 0
    profiles = {"decode": [None, 0], "mixed": [None, 0]}  # kind -> [profiler, steps profiled]
    torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        decode_only = not engine.scheduler.waiting and all(
            s.num_computed_tokens >= s.num_tokens - 1 for s in engine.scheduler.running)
        batch = len(engine.scheduler.running)
        kind = "decode" if decode_only else "mixed"
        entry = profiles[kind]
        if entry[0] is None and entry[1] == 0 and (batch >= 200 if decode_only else batch >= 32):
            entry[0] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            entry[0].__enter__()
        t, w = time.perf_counter(), waited[0]
        outputs = engine.step()
        steps.append((time.perf_counter() - t, decode_only, batch, waited[0] - w))
        tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
        for other in profiles.values():
            if other[0] is not None and other[1] < 4:
                other[1] += 1
                if other[1] == 4:
                    torch.cuda.synchronize()
                    other[0].__exit__(None, None, None)
    seconds = time.perf_counter() - start
    torch.cuda.set_sync_debug_mode(0)

    def summary(rows):
        n = max(len(rows), 1)
        return {"steps": len(rows), "seconds": round(sum(r[0] for r in rows), 3),
                "mean_ms": round(1e3 * sum(r[0] for r in rows) / n, 2),
                "mean_wait_ms": round(1e3 * sum(r[3] for r in rows) / n, 2),  # host idle, device busy
                "mean_batch": round(sum(r[2] for r in rows) / n, 1)}
    result = {"model": f"Llama-3-8B shape, {num_layers} layers, bf16", "output_tokens": tokens,
              "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
              "decode_steps": summary([s for s in steps if s[1]]),
              **{f"decode_steps_batch_{lo}_{hi}": summary([s for s in steps if s[1] and lo <= s[2] < hi])
                 for lo, hi in ((1, 32), (32, 96), (96, 192), (192, 257))},
              "mixed_steps": summary([s for s in steps if not s[1]]),
              "async_scheduling": engine.async_scheduling, "cuda_graphs": engine.runner.cuda_graphs is not None,
              "allocator": {k: v for k, v in torch.cuda.memory_stats().items()
                            if k in ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms")},
              "synchronizing_calls": sum(syncs.values())}
    print(json.dumps(result, indent=1), flush=True)
    (out / f"profile_gpu_{max_num_batched_tokens}.json").write_text(json.dumps(result, indent=1))
    text = "".join(f"==== {n} synchronizing calls from\n{stack}\n" for stack, n in
                   sorted(syncs.items(), key=lambda kv: -kv[1])[:8])
    for kind, (prof, _) in profiles.items():
        if prof is not None:
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60)
            cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60)
            text += f"==== 4 steps from the first {kind} step of batch >= {200 if kind == 'decode' else 32}\n{table}\n{cpu}\n"
    print(text, flush=True)
    (out / f"profile_gpu_{max_num_batched_tokens}.txt").write_text(text)


if __name__ == "__main__":
    main()
