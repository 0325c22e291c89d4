"""`gdserve bench throughput --data-parallel-size N` on the tiny model: the router's split of the
requests, both runs written with their ratio, replicas that fail named, bad flags refused."""
import json

import pytest
import torch

from gdserve.bench.data_parallel import PREFIX_TOKENS, run_replicas, split_requests
from gdserve.entrypoints.cli import main
from tests.bench.conftest import ENGINE_FLAGS, assert_refused


def requests_with_prefixes(num_prefixes: int, per_prefix: int) -> list[dict]:
    return [{"prompt_ids": [p + 3] * PREFIX_TOKENS + [i + 3], "max_tokens": 2}
            for p in range(num_prefixes) for i in range(per_prefix)]


def test_each_request_goes_to_one_replica_and_a_shared_prefix_stays_together():
    requests = requests_with_prefixes(12, 3)
    shares = split_requests(requests, 3, threshold=1000)
    assert sorted(i for share in shares for i in share) == list(range(len(requests)))
    replica_of = {i: r for r, share in enumerate(shares) for i in share}
    for p in range(12):
        assert len({replica_of[3 * p + i] for i in range(3)}) == 1
    assert all(shares)  # 12 prefixes spread over the 3 replicas


def test_a_new_replica_takes_keys_only_from_the_others():
    requests = [{"prompt_ids": [i % 250 + 3, i // 250 + 3], "max_tokens": 1} for i in range(600)]
    before = {i: r for r, share in enumerate(split_requests(requests, 3, threshold=10**6)) for i in share}
    after = {i: r for r, share in enumerate(split_requests(requests, 4, threshold=10**6)) for i in share}
    moved = [i for i in before if before[i] != after[i]]
    assert moved and all(after[i] == 3 for i in moved)  # rendezvous hashing: only to the new one
    assert 0.15 < len(moved) / len(requests) < 0.35


def test_a_busy_home_sends_requests_to_the_least_loaded():
    shares = split_requests(requests_with_prefixes(1, 40), 2, threshold=8)
    assert sorted(map(len, shares)) == [16, 24]  # the home keeps at most 8 more than the other


def test_cli_writes_one_engine_and_the_replicas_and_their_ratio(tiny_llama_dir, tiny_workload, tmp_path, capsys):
    output = tmp_path / "dp.json"
    main(["bench", "throughput", str(tiny_llama_dir), "--workload", "cpu", "--num-requests", "6",
          "--data-parallel-size", "2", "--device", "cpu", "--output", str(output), *ENGINE_FLAGS])
    r = json.loads(output.read_text())
    expected = sum(3 + i for i in range(6))  # EOS ignored: every request runs to its max_tokens
    assert r["engine"]["output_tokens"] == r["data_parallel"]["output_tokens"] == expected
    replicas = r["data_parallel"]["replicas"]
    assert [x["index"] for x in replicas] == [0, 1] and all(x["device"] == "cpu" for x in replicas)
    assert sum(x["num_requests"] for x in replicas) == 6
    assert sum(x["output_tokens"] for x in replicas) == expected
    assert r["ratio"] == pytest.approx(r["data_parallel"]["tokens_per_s"] / r["engine"]["tokens_per_s"])
    assert "ratio replicas / one engine" in capsys.readouterr().out


def test_a_replica_that_fails_is_named_and_nothing_hangs(tmp_path):
    with pytest.raises(RuntimeError, match="replica [01]: "):
        run_replicas(requests_with_prefixes(2, 2), str(tmp_path / "no-model"), {"device": "cpu"}, 2)


@pytest.mark.parametrize("flags, message", [
    (["-dp", "0"], "--data-parallel-size must be >= 1"),
    (["-dp", "2", "--workload", "guided"], "--data-parallel-size runs on --workload cpu or random"),
    (["-dp", "2", "--lora", "2"], "separate benchmarks"),
    (["-dp", "2", "-tp", "2"], "with --tensor-parallel-size > 1 is not supported"),
    (["-dp", "2", "--dataset-name", "random"], "not on a dataset"),
    (["-dp", "2", "--device", "cuda:1"], "pass --device auto, cuda or cpu, not cuda:1"),
    pytest.param(["-dp", "2", "--device", "cuda"], "--data-parallel-size 2 needs 2 CUDA devices",
                 marks=pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="two CUDA devices are visible")),
])
def test_bad_flags_are_refused_before_loading(flags, message, capsys):
    assert_refused("throughput", flags, message, capsys)
