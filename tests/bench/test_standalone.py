"""The benches on a machine without the team's shared material: `make bench`'s command on the
default model, and the agents bench with no --schema-dir, each run as a user runs it (a new
process, another working directory) with $GDSERVE_SHARED pointing at nothing."""
import json
import os
import subprocess
import sys

import pytest


def run_bench(tmp_path, *args: str, cache: str | None = None) -> dict:
    """`gdserve bench throughput ARGS --output FILE` from tmp_path; the figures it wrote."""
    out = tmp_path / "result.json"
    env = {**os.environ, "GDSERVE_SHARED": str(tmp_path / "no-shared")}
    if cache is not None:
        env["GDSERVE_CACHE"] = cache
    done = subprocess.run([sys.executable, "-m", "gdserve.entrypoints.cli", "bench", "throughput", *args,
                           "--output", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(out.read_text())


def test_make_bench_runs_on_the_default_model(smollm2_dir, tmp_path):
    r = run_bench(tmp_path, "--num-requests", "2", "--hf-batch-size", "2", cache=str(smollm2_dir.parent))
    assert r["workload"] == "cpu" and r["num_requests"] == 2
    assert r["engine"]["output_tokens"] == r["hf"]["output_tokens"] > 0
    assert r["ratio"] == pytest.approx(r["engine"]["tokens_per_s"] / r["hf"]["tokens_per_s"])


def test_the_agents_bench_draws_from_the_repository_schemas(smollm2_dir, tmp_path):
    r = run_bench(tmp_path, "--workload", "agents", "--num-requests", "3", "--max-tokens", "32",
                  "--grammar-compile-timeout-s", "120", cache=str(smollm2_dir.parent))
    schemas = r["schemas"]
    assert schemas["requested"] == 3 and schemas["accepted"] >= 1  # a refusal is max_tokens 32 too short
    assert all("max_tokens 32" in x["error"] for x in schemas["refusals"])
    names = [x["schema"] for x in r["compile_ms"]["per_schema"]]
    assert len(names) == 3 and all(name.startswith("schemas/") for name in names)
    assert r["cold"]["output_tokens"] == r["unguided"]["output_tokens"] > 0
    assert r["outputs"]["invalid"] == 0
