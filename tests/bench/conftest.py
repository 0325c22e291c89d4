import pytest

# Engine flags that keep the tiny model's bench runs small.
ENGINE_FLAGS = ["--dtype", "float32", "--max-num-batched-tokens", "64", "--kv-cache-memory", str(1 << 22),
                "--block-size", "4"]
# The standard workloads' interface at the tiny model's scale (its vocabulary has 259 tokens).
TINY_WORKLOAD = '''
def cpu_workload(n=64, vocab=259, seed=0):
    return [{"id": i, "prompt_ids": [(7 * i + j) % 250 + 3 for j in range(4 + i)], "max_tokens": 3 + i}
            for i in range(n)]
random_workload = guided_workload = cpu_workload
'''


@pytest.fixture
def tiny_workload(tmp_path, monkeypatch):
    """$GDSERVE_SHARED pointed at TINY_WORKLOAD."""
    (tmp_path / "shared" / "bench").mkdir(parents=True)
    (tmp_path / "shared" / "bench" / "workload.py").write_text(TINY_WORKLOAD)
    monkeypatch.setenv("GDSERVE_SHARED", str(tmp_path / "shared"))


def assert_refused(subcommand: str, flags: list[str], message: str, capsys) -> None:
    """`gdserve bench SUBCOMMAND` with flags exits naming the problem before loading a model."""
    from gdserve.entrypoints.cli import main
    with pytest.raises(SystemExit):
        main(["bench", subcommand, "/nonexistent-model", *flags])
    assert message in capsys.readouterr().err
