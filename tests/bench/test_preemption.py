"""`gdserve bench throughput --compare-preemption` on the tiny model: a KV cache too small for the
workload, both modes run, the same tokens, swap / recompute written."""
import json

import pytest

from gdserve.entrypoints.cli import main
from tests.bench.conftest import ENGINE_FLAGS, assert_refused


def test_cli_writes_both_modes_and_their_ratio(tiny_llama_dir, tiny_workload, tmp_path, capsys):
    output = tmp_path / "preemption.json"
    main(["bench", "throughput", str(tiny_llama_dir), "--compare-preemption", "--num-requests", "12",
          "--num-gpu-blocks-override", "12", "--swap-space", "0.01",
          "--schedule-conservativeness", "0", "--output", str(output), *ENGINE_FLAGS])
    r = json.loads(output.read_text())
    assert {"command", "date", "commit", "machine", "device"} <= set(r)
    expected = sum(3 + i for i in range(12))  # EOS ignored: every request runs to its max_tokens
    assert r["recompute"]["output_tokens"] == r["swap"]["output_tokens"] == expected
    assert r["recompute"]["num_preemptions"] > 0 and r["recompute"]["num_swap_outs"] == 0
    assert r["swap"]["num_swap_outs"] > 0
    assert r["ratio"] == pytest.approx(r["swap"]["tokens_per_s"] / r["recompute"]["tokens_per_s"])
    assert "ratio swap / recompute" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--compare-preemption", "--preemption-mode", "swap"], "--preemption-mode swap conflicts with --compare-preemption"),
    (["--compare-preemption", "--lora", "2"], "--compare-preemption and --lora are separate benchmarks"),
    (["--compare-preemption", "--workload", "guided"], "--compare-preemption runs on --workload cpu or random"),
])
def test_bad_flags_are_refused_before_loading(flags, message, capsys):
    assert_refused("throughput", flags, message, capsys)
