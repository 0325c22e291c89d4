"""The standard workloads the benches own: their shapes, their determinism, and, where the team's
reference definitions are present ($GDSERVE_SHARED/bench, as in CI), the same requests as those."""
import importlib.util
import json

import pytest

from gdserve.bench import workloads


def test_random_workload_has_the_documented_shape():
    requests = workloads.random_workload(n=50, seed=3)
    assert [r["id"] for r in requests] == list(range(50))
    assert all(128 <= len(r["prompt_ids"]) <= 1024 and 64 <= r["max_tokens"] <= 512 for r in requests)
    assert all(1000 <= t < 49152 for r in requests for t in r["prompt_ids"])
    assert requests == workloads.random_workload(n=50, seed=3)
    assert requests != workloads.random_workload(n=50, seed=4)


def test_cpu_workload_is_the_random_one_scaled_down():
    requests = workloads.cpu_workload()
    assert len(requests) == 64
    assert all(32 <= len(r["prompt_ids"]) <= 256 and 16 <= r["max_tokens"] <= 128 for r in requests)


def test_guided_workload_cycles_through_its_schemas():
    schemas = json.loads(workloads.GUIDED_SCHEMAS.read_text())
    requests = workloads.guided_workload(n=20, max_tokens=100)
    assert all(r["max_tokens"] == 100 for r in requests)
    assert [r["json_schema"] for r in requests] == [schemas[i % len(schemas)] for i in range(20)]


def _reference():
    path = workloads.shared_dir() / "bench" / "workload.py"
    if not path.exists():
        pytest.skip(f"the team's reference workloads are not at {path} ($GDSERVE_SHARED/bench/workload.py)")
    spec = importlib.util.spec_from_file_location("reference_workload", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, kwargs", [("random_workload", {}), ("cpu_workload", {}),
                                          ("guided_workload", {}), ("random_workload", {"n": 7, "seed": 11}),
                                          ("guided_workload", {"n": 9, "prompt_len": (32, 256), "max_tokens": 128})])
def test_the_same_requests_as_the_reference(name, kwargs):
    reference = _reference()
    assert getattr(workloads, name)(**kwargs) == getattr(reference, name)(**kwargs)
    assert workloads.LLAMA3_8B_SHAPE == reference.LLAMA3_8B_SHAPE
