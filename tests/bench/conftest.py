import pytest

from gdserve.bench import workloads

# Engine flags that keep the tiny model's bench runs small.
ENGINE_FLAGS = ["--dtype", "float32", "--max-num-batched-tokens", "64", "--kv-cache-memory", str(1 << 22),
                "--block-size", "4"]


def tiny_cpu_workload(n: int = 64, vocab: int = 259, seed: int = 0) -> list[dict]:
    """The standard workloads' interface at the tiny model's scale (its vocabulary has 259 tokens)."""
    return [{"id": i, "prompt_ids": [(7 * i + j) % 250 + 3 for j in range(4 + i)], "max_tokens": 3 + i}
            for i in range(n)]


@pytest.fixture
def tiny_workload(monkeypatch):
    """The benches' cpu and random workloads replaced by tiny_cpu_workload."""
    monkeypatch.setattr(workloads, "cpu_workload", tiny_cpu_workload)
    monkeypatch.setattr(workloads, "random_workload", tiny_cpu_workload)


def assert_refused(subcommand: str, flags: list[str], message: str, capsys) -> None:
    """`gdserve bench SUBCOMMAND` with flags exits naming the problem before loading a model."""
    from gdserve.entrypoints.cli import main
    with pytest.raises(SystemExit):
        main(["bench", subcommand, "/nonexistent-model", *flags])
    assert message in capsys.readouterr().err
