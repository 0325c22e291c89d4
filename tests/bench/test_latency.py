"""`gdserve bench latency` on the tiny model: vLLM's fields, consistent with each other."""
import json

import pytest

from gdserve.entrypoints.cli import main
from tests.bench.conftest import ENGINE_FLAGS, assert_refused


def test_cli_writes_vllm_latency_fields(tiny_llama_dir, tmp_path, capsys):
    output = tmp_path / "latency.json"
    main(["bench", "latency", str(tiny_llama_dir), "--input-len", "12", "--output-len", "8", "--batch-size", "3",
          "--num-iters-warmup", "1", "--num-iters", "3", "--output-json", str(output), *ENGINE_FLAGS])
    r = json.loads(output.read_text())
    assert {"command", "date", "commit", "machine", "device"} <= set(r)
    assert len(r["latencies"]) == 3 and r["avg_latency"] == pytest.approx(sum(r["latencies"]) / 3)
    assert list(r["percentiles"]) == ["10", "25", "50", "75", "90", "99"]
    assert min(r["latencies"]) <= r["percentiles"]["50"] <= max(r["latencies"])
    assert r["output_tokens_per_s"] == pytest.approx(3 * 8 / r["avg_latency"])
    assert "Avg latency:" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--num-iters-warmup", "-1"], "--num-iters-warmup must be >= 0"),
    (["--output-len", "0"], "--output-len must be >= 1"),
])
def test_bad_flags_are_refused_before_loading(flags, message, capsys):
    assert_refused("latency", flags, message, capsys)
