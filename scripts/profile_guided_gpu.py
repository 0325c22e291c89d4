"""Device diagnostic: where the guided step's host time goes. Runs guided_workload(n=256) guided,
then the same work unguided (each request's max_tokens = its guided length, as `gdserve bench
throughput --workload guided`), stepping the engine by hand and timing the host's phases per run:
scheduling, input preparation and launch, waiting for the device's sampled tokens, taking them in
(matcher advances, detokenizing), the guided bitmask, sampling, and the garbage collector; on CUDA
also where the device waits for the host (DeviceGaps), which is what the host costs the run.
Usage: python3 scripts/profile_guided_gpu.py [NUM_LAYERS] [--tiny] [--threads=N] [--trace=FIRST-LAST]
    [--tokenizer=DIR|byte-pair]
(GDSERVE_SHARED and the tokenizer as for bench_gpu.py; writes profile_guided.json under $OUT.
--tiny: a 64-wide model, for a dry run on the CPU. --threads: torch's intra-op threads. --trace:
the steps torch.profiler records, default 100-109.)"""
import gc
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import test_gpu  # noqa: E402


class PhaseTimer:
    """Wraps methods so that each call's host time adds to its phase; the engine's wait for the
    device's sampled tokens is counted apart (and taken out of the phase that waits)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.per_step: list[tuple[int, float]] = []  # (step, seconds) of the phase `traced`
        self.traced, self.step = "execute.logits", 0

    def wrap(self, owner, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            t, w = time.perf_counter(), self.seconds["wait"]
            try:
                return inner(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t - (self.seconds["wait"] - w)
                self.seconds[phase] += spent
                if phase == self.traced:
                    self.per_step.append((self.step, spent))
        setattr(owner, name, timed)

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.seconds["gc"] += time.perf_counter() - self._gc_start


class DeviceGaps:
    """Where the device waits for the host, per step, from CUDA events on the step's stream:
    `fill` from the forward's end to the bitmask's and sampler's launch (the host still taking in
    the last tokens and filling the bitmask), `between` from the sampler's end to the next
    forward's launch (the host still scheduling and preparing the next step). An event the host
    records late, on an idle stream, completes at once: the elapsed time is the device's idle time."""

    def __init__(self):
        self.steps: list[dict] = []

    def wrap(self, runner, engine) -> None:
        import torch
        execute, sample = runner.execute, engine._sample

        def record() -> "torch.cuda.Event":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        def timed_execute(seqs, num_new_tokens, *args, **kwargs):
            step = {"start": record(), "rows": len(seqs), "tokens": sum(num_new_tokens)}
            self.steps.append(step)
            try:
                return execute(seqs, num_new_tokens, *args, **kwargs)
            finally:
                step["forward_end"] = record()

        def timed_sample(*args, **kwargs):
            self.steps[-1]["sample_start"] = record()
            try:
                return sample(*args, **kwargs)
            finally:
                self.steps[-1]["end"] = record()
        runner.execute, engine._sample = timed_execute, timed_sample

    def summary(self) -> dict:
        """Call after a device sync. Totals (s) and the 8 largest gaps of each kind (ms, step,
        rows, tokens)."""
        steps = [s for s in self.steps if "end" in s]
        fill = [(s["forward_end"].elapsed_time(s["sample_start"]), i, s) for i, s in enumerate(steps)]
        between = [(a["end"].elapsed_time(b["start"]), i, a) for i, (a, b) in enumerate(zip(steps, steps[1:]))]
        busy = sum(s["start"].elapsed_time(s["end"]) for s in steps) / 1e3
        self.steps.clear()

        def top(gaps):
            return [(round(ms, 2), i, s["rows"], s["tokens"]) for ms, i, s in sorted(gaps, key=lambda g: g[0])[-8:]]
        return {"step_span_s": round(busy, 3), "fill_gap_s": round(sum(g[0] for g in fill) / 1e3, 3),
                "between_gap_s": round(sum(g[0] for g in between) / 1e3, 3),
                "top_fill_gaps": top(fill), "top_between_gaps": top(between)}


ALLOCATOR_STATS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")


def run(engine, requests: list[dict], params: list, timer: PhaseTimer, sync, trace_steps: range = range(0),
        gaps: DeviceGaps | None = None) -> dict:
    """Step the requests to the end; torch.profiler over trace_steps (CPU side: which runtime
    calls the host spends its time in)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for r, p in zip(requests, params):
        engine.add_request(r["prompt_ids"], p)
    timer.seconds.clear()
    sync()
    stats = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
    start, steps, lengths, prof = time.perf_counter(), 0, {}, None
    while engine.has_unfinished_requests():
        if steps == trace_steps.start and len(trace_steps):
            prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else []))
            prof.__enter__()
        timer.step = steps
        for out in engine.step():
            if out.finished:
                lengths[out.request_id] = len(out.outputs[0].token_ids)
        steps += 1
        if prof is not None and steps == trace_steps.stop:
            prof.__exit__(None, None, None)
    sync()
    seconds = time.perf_counter() - start
    tokens = sum(lengths.values())
    phases = {k: round(v, 3) for k, v in sorted(timer.seconds.items())}
    after = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
    result = {"seconds": round(seconds, 3), "output_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
              "steps": steps, "host_s": phases, "lengths": [lengths[k] for k in sorted(lengths, key=int)],
              "allocator": {k: after.get(k, 0) - stats.get(k, 0) for k in ALLOCATOR_STATS}}
    if gaps is not None:
        result["device_gaps"] = gaps.summary()
    if prof is not None:
        averages = prof.key_averages()
        result["trace"] = averages.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=50)
        if torch.cuda.is_available():
            result["trace"] += averages.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=50)
    result["slowest_logits_ms"] = sorted((round(1e3 * t, 1), step) for step, t in timer.per_step)[-12:]
    timer.per_step.clear()
    return result


def main() -> None:
    test_gpu.setup_imports()
    import torch
    from gdserve import LLM, SamplingParams
    from gdserve.bench.workloads import load_workload_module
    from gdserve.engine.sampler import HostSamplerOutput
    from gdserve.sampling_params import GuidedDecodingParams
    from gdserve.utils import settle_gc
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    threads = [int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--threads=")]
    if threads:
        torch.set_num_threads(threads[0])
    num_layers = int(args[0]) if args else 32
    tiny = "--tiny" in sys.argv
    trace = next((a.split("=")[1] for a in sys.argv[1:] if a.startswith("--trace=")), "100-109")
    trace_steps = range(int(trace.split("-")[0]), int(trace.split("-")[1]) + 1)
    cuda = torch.cuda.is_available()
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    requests = load_workload_module().guided_workload(n=256, **({"prompt_len": (16, 64)} if tiny else {}))
    tokenizer = test_gpu.tokenizer_arg(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        test_gpu.save_model_dir(Path(tmp), num_layers, tokenizer)
        if tiny:
            config = json.loads((Path(tmp) / "config.json").read_text())
            config.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16)
            (Path(tmp) / "config.json").write_text(json.dumps(config))
        llm = LLM(tmp, load_format="dummy", dtype="bfloat16" if cuda else "float32",
                  **({} if cuda else {"kv_cache_memory": 2**30, "max_num_seqs": 256}))
    engine = llm.engine
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    guided = [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, output_kind="final_only",
                             guided=GuidedDecodingParams(json=r["json_schema"])) for r in requests]
    for p in guided:
        engine.guided.submit(p.guided).result()
    llm.generate([{"prompt_token_ids": requests[0]["prompt_ids"]}], guided[:1])
    settle_gc()  # as the server, and `gdserve bench throughput`, once the engine has loaded

    timer = PhaseTimer()
    wait = HostSamplerOutput.wait

    def timed_wait(self):
        t = time.perf_counter()
        if self.ready is not None:
            self.ready.synchronize()
        timer.seconds["wait"] += time.perf_counter() - t
        return wait(self)
    HostSamplerOutput.wait = timed_wait
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine.runner, "execute", "execute")
    timer.wrap(engine, "_take_pending", "take_pending")
    timer.wrap(engine.guided, "apply_bitmask", "guided_bitmask")
    timer.wrap(engine, "_sample", "sample")
    # Within those: execute's input preparation and logits; the bitmask's fill, stack and apply.
    import gdserve.engine.guided as guided_module
    timer.wrap(engine.runner, "_prepare", "execute.prepare")
    timer.wrap(engine.model, "compute_logits", "execute.logits")
    if engine.runner.cuda_graphs is not None:
        timer.wrap(engine.runner.cuda_graphs, "run", "execute.graph_run")
    timer.wrap(guided_module, "stack_rows", "guided_bitmask.stack")
    timer.wrap(guided_module, "apply_token_bitmask", "guided_bitmask.apply")
    timer.wrap(engine, "_check_finished", "take_pending.check_finished")
    gc.callbacks.append(timer.on_gc)
    gaps = None
    if cuda:
        gaps = DeviceGaps()
        gaps.wrap(engine.runner, engine)  # outermost: its events bracket the timed phases
    result = {"model": f"Llama-3-8B shape, {num_layers} layers" + (", 64 wide" if tiny else ""),
              "device": torch.cuda.get_device_name() if cuda else "cpu", "torch_threads": torch.get_num_threads(),
              "cpu_count": os.cpu_count(), "tokenizer": "synthetic byte pairs" if tokenizer is None else str(tokenizer)}
    result["guided"] = run(engine, requests, guided, timer, sync, trace_steps, gaps)
    grammars = {id(g): g for g in (engine.guided.submit(p.guided).result() for p in guided)}.values()
    result["guided"]["states_built"] = sum(len(g._masks) for g in grammars)
    unguided = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, output_kind="final_only")
                for n in result["guided"]["lengths"]]
    engine.kv_cache.reset_prefix_cache()
    result["unguided"] = run(engine, requests, unguided, timer, sync, trace_steps, gaps)
    result["ratio"] = round(result["guided"]["tokens_per_s"] / result["unguided"]["tokens_per_s"], 3)
    engine.close()
    for key in ("guided", "unguided"):
        del result[key]["lengths"]
    traces = {key: result[key].pop("trace", "") for key in ("guided", "unguided")}
    print(json.dumps(result, indent=1), flush=True)
    for key, trace in traces.items():
        print(f"{key} steps {trace_steps.start}-{trace_steps.stop - 1}:\n{trace}", flush=True)
    (out / "profile_guided.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
