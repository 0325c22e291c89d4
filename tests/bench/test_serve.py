"""`gdserve bench serve` against a real tiny-model server: a handful of requests, the JSON has
vLLM benchmark_serving's fields with sane values."""
import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest

from gdserve.bench.serve import parse_serve_bench_args, run_load, run_serve_bench
from tests.engine.test_progress import fake_terminal
from tests.entrypoints.openai.conftest import start_server, stop_server

FIELDS = ["completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens", "request_throughput",
          "output_throughput", "total_token_throughput"] + [
    f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p99")]


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    proc, server = start_server(tiny_llama_dir, tmp_path_factory.mktemp("logs") / "bench.log",
                                "--kv-cache-memory", "8000000")
    yield server
    stop_server(proc)


def _bench(server, tmp_path, *args: str) -> dict:
    out = tmp_path / "serve.json"
    cmd = [sys.executable, "-m", "gdserve.entrypoints.cli", "bench", "serve", "--base-url", f"{server.url}/v1",
           "--num-requests", "6", "--vocab-size", "259", "--max-prompt-len", "40", "--max-output-len", "12",
           "--output", str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "request throughput" in done.stdout
    assert "Requests done" not in done.stderr  # stderr is a pipe: no progress bar
    return json.loads(out.read_text())


@pytest.mark.parametrize("load", [["--max-concurrency", "3"], ["--request-rate", "20"]])
def test_bench_serve_reports_vllm_metrics(server, tmp_path, load):
    r = _bench(server, tmp_path, *load)
    for name in FIELDS:
        assert isinstance(r[name], (int, float)) and r[name] >= 0, name
    assert r["model"] == server.model and r["completed"] == 6 and r["failed"] == 0
    assert r["total_input_tokens"] == 6 * 40            # cpu_workload prompts are >= 32 tokens, clipped to 40
    assert r["total_output_tokens"] == 6 * 12  # EOS ignored: every request runs to its max_tokens
    assert r["output_throughput"] == pytest.approx(r["total_output_tokens"] / r["duration_s"])
    assert 0 < r["mean_ttft_ms"] <= r["mean_e2el_ms"] <= r["duration_s"] * 1000
    assert 0 < r["median_tpot_ms"] and 0 < r["mean_itl_ms"] <= r["p99_itl_ms"]
    assert r["request_rate"] == ("inf" if "--max-concurrency" in load else 20.0)


def test_run_serve_bench_from_a_script(server, capsys):
    args = parse_serve_bench_args(["--base-url", f"{server.url}/v1", "--model", server.model, "--num-requests", "3",
                                   "--vocab-size", "259", "--max-prompt-len", "40", "--max-output-len", "5",
                                   "--max-concurrency", "2"])
    assert args.workload == "cpu" and args.output is None  # the command's defaults
    r = run_serve_bench(args)
    assert r["model"] == server.model and r["max_concurrency"] == 2
    assert r["completed"] == 3 and r["total_output_tokens"] == 3 * 5
    assert "request throughput" in capsys.readouterr().out


def test_offline_ratio(server, tmp_path):
    offline = tmp_path / "offline.json"
    offline.write_text(json.dumps({"workload": "cpu", "num_requests": 6, "engine": {"tokens_per_s": 10.0}}))
    r = _bench(server, tmp_path, "--offline-result", str(offline))
    assert r["offline_output_throughput"] == 10.0
    assert r["server_over_offline"] == pytest.approx(r["output_throughput"] / 10.0)
    offline.write_text(json.dumps({"workload": "cpu", "num_requests": 64, "engine": {"tokens_per_s": 10.0}}))
    cmd = [sys.executable, "-m", "gdserve.entrypoints.cli", "bench", "serve", "--base-url", f"{server.url}/v1",
           "--num-requests", "6", "--vocab-size", "259", "--max-prompt-len", "40", "--max-output-len", "4",
           "--offline-result", str(offline)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "compare the same work" in done.stderr


def test_bench_serve_shows_a_bar_on_a_terminal(server, monkeypatch):
    terminal = fake_terminal(monkeypatch)
    requests = [{"prompt_ids": [5, 6, 7], "max_tokens": 3}] * 2

    async def load():
        async with aiohttp.ClientSession() as session:
            return await run_load(session, f"{server.url}/v1/completions", server.model, requests,
                                  float("inf"), None, seed=0)

    results, _ = asyncio.run(load())
    assert all(r.error is None for r in results)
    assert "Requests done" in terminal.getvalue() and "2/2" in terminal.getvalue()
