"""A cost model of random_workload() n=256 on the engine's schedule (no device needed): what a run
would take if every step cost its floor. Each step's GEMMs take the larger of reading the weights
and their FLOPs at the GEMM peak, its decode attention reads its rows' KV at the copy bandwidth,
and its prefill attention runs at ATTENTION_FLOPS. Steps follow the scheduler: running sequences
first (decode rows, then unfinished prefill chunks), then admission up to max_num_seqs, in one
token budget. Prints the floor in seconds and tokens/s per schedule: FCFS at several
max_num_seqs, and admission by longest max_tokens first (which reads what the benchmark's
ignore_eos makes exact). Usage: GDSERVE_SHARED=../shared python3 scripts/schedule_model.py"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(os.environ.get("GDSERVE_SHARED", "../shared")) / "bench"))
from workload import LLAMA3_8B_SHAPE, random_workload  # noqa: E402

GEMM_FLOPS = 710e12       # what cuBLAS reaches on the H200 on the prefill's GEMMs (README)
COPY_BANDWIDTH = 4.3e12   # bytes/s, measured copy bandwidth
ATTENTION_FLOPS = 400e12  # torch SDPA's flash kernel on dense prompts measured 390 TFLOP/s
VOCAB = 49152


def model_sizes() -> tuple[float, float, float, float]:
    """(weight bytes read per step, GEMM FLOPs per token, LM-head FLOPs per sampled row, KV bytes
    per token of context) for the Llama-3-8B shape in bf16."""
    c = LLAMA3_8B_SHAPE
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * inter
    head = h * VOCAB
    return 2 * (layers * per_layer + head), 2 * layers * per_layer, 2 * head, 2 * 2 * layers * kv


def run(max_num_seqs: int, budget: int = 8192, longest_first: bool = False) -> float:
    weights, flops, head_flops, kv_bytes = model_sizes()
    layers, hidden = LLAMA3_8B_SHAPE["num_hidden_layers"], LLAMA3_8B_SHAPE["hidden_size"]
    work = random_workload()
    if longest_first:
        work = sorted(work, key=lambda r: -r["max_tokens"])
    waiting = [{"prompt": len(r["prompt_ids"]), "done": 0, "out": 0, "max": r["max_tokens"]} for r in work]
    running, seconds = [], 0.0
    while waiting or running:
        step = {"left": budget, "tokens": 0, "sampled": 0, "kv_read": 0, "attention": 0.0}

        def schedule(seq: dict) -> None:
            context = seq["done"] + seq["out"]
            if seq["done"] == seq["prompt"]:  # a decode row
                n = 1
                step["kv_read"] += context
            else:                             # a prefill chunk
                n = min(seq["prompt"] - seq["done"], step["left"])
                step["attention"] += 4 * hidden * n * (context + n / 2) * layers
                seq["done"] += n
            step["tokens"] += n
            step["left"] -= n
            if seq["done"] == seq["prompt"]:  # samples a token
                step["sampled"] += 1
                seq["out"] += 1

        for seq in running:
            if step["left"] == 0:
                break
            schedule(seq)
        while waiting and step["left"] > 0 and len(running) < max_num_seqs:
            running.append(waiting.pop(0))
            schedule(running[-1])
        gemm_flops = step["tokens"] * flops + step["sampled"] * head_flops
        seconds += max(weights / COPY_BANDWIDTH, gemm_flops / GEMM_FLOPS)
        seconds += step["kv_read"] * kv_bytes / COPY_BANDWIDTH + step["attention"] / ATTENTION_FLOPS
        running = [s for s in running if s["out"] < s["max"]]
    return seconds


def main() -> None:
    outputs = sum(r["max_tokens"] for r in random_workload())
    print(f"random_workload() n=256: {outputs} output tokens; floor seconds and tokens/s")
    for longest_first in (False, True):
        for seats in (256, 224, 192, 160, 128):
            t = run(seats, longest_first=longest_first)
            order = "longest max_tokens first" if longest_first else "FCFS"
            print(f"{order:>24}, max_num_seqs {seats}: {t:.2f} s, {outputs / t:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
