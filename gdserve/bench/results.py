"""What every bench records beside its figures (the command, the hardware, the date, the commit),
and how the figures are written and printed."""
import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from gdserve.bench.workloads import REPO_ROOT
from gdserve.config import EngineConfig


def git_commit() -> str | None:
    """The checkout's HEAD, or None where the package runs outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def run_header(args: argparse.Namespace, config: EngineConfig, num_requests: int) -> dict:
    device = config.torch_device()
    return {"command": " ".join(["gdserve"] + sys.argv[1:]), "workload": args.workload,
            "num_requests": num_requests, "model": args.model, "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "dtype": str(config.torch_dtype()), "kv_cache_dtype": str(config.torch_kv_cache_dtype()),
            "fp8_attention": config.fp8_attention, "quantization": config.quantization,
            "torch_threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit()}


def rate(tokens: int, seconds: float) -> dict:
    return {"output_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0}


def percentiles(values: list[float], qs: tuple[int, ...]) -> dict:
    if not values:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": round(float(v), 3) for q, v in zip(qs, np.percentile(values, qs))}


def write_result(result: dict, output: str | None) -> None:
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {output}", file=sys.stderr)


def print_rate(name: str, r: dict) -> None:
    steps = f" ({r['forward_steps']} forward steps, {r['forced_share']:.1%} of the tokens forced)" \
        if r.get("forced_share") is not None else ""
    print(f"{name:>8}: {r['output_tokens']} output tokens in {r['seconds']:.1f} s = "
          f"{r['tokens_per_s']:.1f} tokens/s{steps}")
