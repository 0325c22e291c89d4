"""TensorRT-LLM's published H200 throughput table, run on gdserve: Llama-3-8B's shape (vocab 128,256,
random weights, a synthetic byte-level tokenizer), fixed input / output lengths, random prompt ids,
each request sampled to its max_tokens with EOS ignored: the requests and sampling parameters of
`gdserve bench throughput --dataset-name random --input-len I --output-len O --num-prompts N`, run
in one process for every row (one engine per mode, warmed once) and timed step by step.

Usage: python3 scripts/trtllm_rows_gpu.py [--modes fp8,bf16] [--rows 128/128,1000/1000,...]
[--scale F] [--max-num-seqs N] [--max-num-batched-tokens N] [--schedule-conservativeness C[,C]]
[--profile ROWS] [--cprofile ROWS]
--modes: fp8 = fp8 weights and fp8 KV cache (TensorRT-LLM's configuration), fp8-attn = the same
with fp8 prefill attention math (fp8_attention), bf16 = bf16 weights and cache. --schedule-conservativeness: one engine per value and mode (default 1.0). --scale: a share of TensorRT-LLM's request counts (1.0: 30,000 / 3,000 / 3,000 / 1,500).
--profile 128/128,...: torch.profiler over a few decode steps at the largest batch, for those rows
of the first mode; --profile-mixed ROWS: over a few steps once the first requests have finished
and new ones are prefilled beside the decodes (the steady state of a long run); --cprofile ROWS: the host's time by function over those rows' timed runs.
Writes trtllm_rows.json (and trtllm_rows_profile.txt) under $OUT."""
import argparse
import cProfile
import io
import json
import pstats
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_common  # noqa: E402

# TensorRT-LLM's performance overview, Llama-3.1-8B FP8 on one H200 (trtllm-bench throughput):
# (input, output) -> (requests, output tokens/s)
TRTLLM = {(128, 128): (30_000, 27_911), (1000, 1000): (3_000, 17_744), (2048, 128): (3_000, 3_538),
          (2048, 2048): (1_500, 12_194)}
MODES = {"fp8": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
         "fp8-attn": {"quantization": "fp8", "kv_cache_dtype": "fp8", "fp8_attention": True}, "bf16": {}}
VOCAB = 128_256


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="fp8")
    p.add_argument("--rows", default=",".join(f"{i}/{o}" for i, o in TRTLLM))
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--schedule-conservativeness", default="1.0")
    p.add_argument("--profile", default="")
    p.add_argument("--profile-mixed", default="")
    p.add_argument("--cprofile", default="")
    return p.parse_args()


class StepTimer:
    """Host seconds per engine step, and how long the host waited for the device's sampled tokens
    (near zero: the host is the bottleneck; most of the step: the device is)."""

    def __init__(self, engine):
        import torch
        from gdserve.engine.sampler import HostSamplerOutput
        self.engine, self.steps, self.waited = engine, [], 0.0
        wait, step, timer = HostSamplerOutput.wait, engine.step, self

        def timed_wait(host):
            start = time.perf_counter()
            result = wait(host)
            timer.waited += time.perf_counter() - start
            return result

        def timed_step():
            start, waited = time.perf_counter(), timer.waited
            batch = len(engine.scheduler.running)
            decode_only = not engine.scheduler.waiting and all(
                s.num_computed_tokens >= s.num_tokens - 1 for s in engine.scheduler.running)
            timer.decode_only = decode_only
            outputs = step()
            timer.steps.append((time.perf_counter() - start, timer.waited - waited, batch, decode_only))
            return outputs
        HostSamplerOutput.wait = timed_wait
        engine.step = timed_step
        self.restore = lambda: setattr(HostSamplerOutput, "wait", wait)
        self.events, self.decode_only = [], False  # (forward's start, its logits' end, decode only) per forward
        execute_step = engine.runner.execute_step

        def timed_execute_step(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            logits = execute_step(*args, **kwargs)
            end.record()
            timer.events.append((start, end, timer.decode_only))
            return logits
        engine.runner.execute_step = timed_execute_step

    def device_gaps(self) -> dict:
        """The device's view of decode-only and mixed forwards: a forward's span (its first launch
        to its logits) and the time until the next forward starts (sampling's kernels and the
        device's idle time), means in ms."""
        import torch
        torch.cuda.synchronize()
        events, self.events = self.events, []
        result = {}
        for kind, decode_only in (("decode", True), ("mixed", False)):
            pairs = [(s, e, s2) for (s, e, d), (s2, _, _) in zip(events, events[1:]) if d == decode_only]
            n = max(len(pairs), 1)
            result[kind] = {"forward_span_ms": round(sum(s.elapsed_time(e) for s, e, _ in pairs) / n, 2),
                            "to_next_forward_ms": round(sum(e.elapsed_time(s2) for _, e, s2 in pairs) / n, 2)}
        return result

    def summary(self) -> dict:
        def part(rows):
            n = max(len(rows), 1)
            return {"steps": len(rows), "seconds": round(sum(r[0] for r in rows), 2),
                    "mean_ms": round(1e3 * sum(r[0] for r in rows) / n, 2),
                    "mean_wait_ms": round(1e3 * sum(r[1] for r in rows) / n, 2),
                    "mean_batch": round(sum(r[2] for r in rows) / n, 1)}
        result = {"decode": part([s for s in self.steps if s[3]]), "mixed": part([s for s in self.steps if not s[3]]),
                  "device": self.device_gaps()}
        self.steps = []
        return result


def profile_steps(llm, requests, out: Path, label: str, mixed: bool) -> None:
    """torch.profiler over 3 steps: decode steps once the batch is full and prefill is done, or
    (mixed) steps once the first requests have finished and new ones are being prefilled."""
    from torch.profiler import ProfilerActivity, profile
    from gdserve.bench.dataset_throughput import engine_inputs
    engine = llm.engine
    prompts, params = engine_inputs(requests)
    request_ids = [engine.add_request(prompt["prompt_token_ids"], param) for prompt, param in zip(prompts, params)]
    if mixed:
        for _ in range(params[0].max_tokens + 8):
            engine.step()
    else:
        while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_tokens - 1
                                              for s in engine.scheduler.running):
            engine.step()
        for _ in range(3):
            engine.step()
    import torch
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            engine.step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    batch = len(engine.scheduler.running)
    for request_id in request_ids:
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    kind = "mixed" if mixed else "decode"
    busy_ms = sum(e.self_device_time_total for e in prof.key_averages()
                  if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3  # the kernels, not the ops launching them
    text = (f"==== {label}: 3 {kind} steps at batch {batch}: {wall_ms:.1f} ms "
            f"wall, {busy_ms:.1f} ms of kernels\n"
            + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=70)
            + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=70))
    print(text, flush=True)
    with open(out / "trtllm_rows_profile.txt", "a") as f:
        f.write(text + "\n")


def main() -> None:
    args = parse_args()
    gpu_common.setup_imports()
    import torch
    from gdserve.bench.dataset_throughput import measure
    from gdserve.bench.datasets.random_tokens import allowed_token_ids, random_requests
    from gdserve.bench.offline import collect_engines, warm_llm
    from gdserve.models.loader import load_tokenizer
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    rows = [tuple(map(int, r.split("/"))) for r in args.rows.split(",")]
    result = {"model": "Llama-3-8B shape, vocab 128256, random weights", "device": torch.cuda.get_device_name(),
              "scale": args.scale, "rows": []}
    overrides = {k: v for k, v in (("max_num_seqs", args.max_num_seqs),
                                   ("max_num_batched_tokens", args.max_num_batched_tokens)) if v is not None}
    with tempfile.TemporaryDirectory() as tmp:
        gpu_common.save_model_dir(Path(tmp), 32, None, vocab_size=VOCAB)
        token_ids = allowed_token_ids(load_tokenizer(tmp))
        engines = [(mode, float(c)) for mode in args.modes.split(",")
                   for c in args.schedule_conservativeness.split(",")]
        for mode, conservativeness in engines:
            engine_args = {"load_format": "dummy", "dtype": "bfloat16", **MODES[mode], **overrides,
                           "schedule_conservativeness": conservativeness}
            start = time.perf_counter()
            llm = warm_llm(tmp, engine_args, [{"prompt_token_ids": [5] * 16}])
            startup = round(time.perf_counter() - start, 1)
            timer = StepTimer(llm.engine)
            for input_len, output_len in rows:
                trt_requests, trt_rate = TRTLLM[(input_len, output_len)]
                num = max(1, round(trt_requests * args.scale))
                requests = random_requests(num, input_len, output_len, token_ids, seed=0)
                host_profile = cProfile.Profile() if f"{input_len}/{output_len}" in args.cprofile.split(",") else None
                if host_profile is not None:
                    host_profile.enable()
                run = measure(llm, requests).fields()
                if host_profile is not None:
                    host_profile.disable()
                    text = io.StringIO()
                    pstats.Stats(host_profile, stream=text).sort_stats("tottime").print_stats(40)
                    with open(out / "trtllm_rows_cprofile.txt", "a") as f:
                        f.write(f"==== {mode} {input_len}/{output_len}\n{text.getvalue()}\n")
                row = {"mode": mode, "input_len": input_len, "output_len": output_len, "num_requests": num,
                       "startup_s": startup, **{k: round(v, 2) if isinstance(v, float) else v for k, v in run.items()},
                       "num_preemptions": llm.engine.scheduler.num_preemptions,
                       "num_kv_blocks": llm.engine.kv_cache.num_blocks,
                       "trtllm_output_tokens_per_second": trt_rate,
                       "vs_trtllm": round(run["output_tokens_per_second"] / trt_rate, 3),
                       "steps": timer.summary(), "engine_args": engine_args}
                llm.engine.scheduler.num_preemptions = 0
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
                (out / "trtllm_rows.json").write_text(json.dumps(result, indent=1))
                label = f"{input_len}/{output_len}"
                if label in args.profile.split(",") and mode == args.modes.split(",")[0]:
                    few = random_requests(llm.engine.config.max_num_seqs, input_len, min(output_len, 64),
                                          token_ids, seed=1)
                    profile_steps(llm, few, out, f"{mode} {label}", mixed=False)
                    timer.summary()
                if label in args.profile_mixed.split(",") and mode == args.modes.split(",")[0]:
                    many = random_requests(2 * llm.engine.config.max_num_seqs, input_len, output_len, token_ids, seed=1)
                    profile_steps(llm, many, out, f"{mode} {label}", mixed=True)
                    timer.summary()
            timer.restore()  # its patch holds the engine, whose KV cache fills the device
            llm.engine.close()
            del llm, timer
            collect_engines()


if __name__ == "__main__":
    main()
