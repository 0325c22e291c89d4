"""`gdserve bench throughput --workload agents` on the tiny model: the report's fields, and that
its counts add up (every request accepted or refused, every accepted output stopped, cut or
failed), with one schema the compiler refuses."""
import json

import pytest

from gdserve.bench.agents import ends_inside_string, load_schemas
from gdserve.entrypoints.cli import main

ENGINE_FLAGS = ["--dtype", "float32", "--max-num-batched-tokens", "64", "--kv-cache-memory", str(1 << 22),
                "--block-size", "4"]
SCHEMAS = {
    "point.json": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                   "required": ["x", "y"], "additionalProperties": False},
    "label.json": {"enum": ["spam", "ham"]},
    "bad_type.json": {"type": "object", "properties": {"a": {"type": "strnig"}}},
}
MASKBENCH_FILE = {"description": "a flag", "meta": {}, "schema": {"type": "boolean"},
                  "tests": [{"description": "true", "valid": True, "data": True}]}


@pytest.fixture
def schema_dir(tmp_path):
    folder = tmp_path / "schemas"
    folder.mkdir()
    for name, schema in SCHEMAS.items():
        (folder / name).write_text(json.dumps(schema))
    (folder / "flag.json").write_text(json.dumps(MASKBENCH_FILE))
    return folder


def run_bench(tiny_llama_dir, schema_dir, tmp_path, *flags) -> dict:
    output = tmp_path / "agents.json"
    main(["bench", "throughput", str(tiny_llama_dir), "--workload", "agents", "--schema-dir", str(schema_dir),
          "--num-requests", "4", "--max-tokens", "24", "--output", str(output), *ENGINE_FLAGS, *flags])
    return json.loads(output.read_text())


def test_report_counts_add_up_with_a_refused_schema(tiny_llama_dir, schema_dir, tmp_path, capsys):
    r = run_bench(tiny_llama_dir, schema_dir, tmp_path, "--grammar-compile-timeout-s", "60")
    assert r["workload"] == "agents" and r["num_requests"] == 4 and r["max_tokens"] == 24
    assert {"command", "date", "commit", "machine", "device"} <= set(r)
    schemas = r["schemas"]
    assert (schemas["accepted"], schemas["refused"]) == (3, 1)
    assert [x["schema"] for x in schemas["refusals"]] == ["schemas/bad_type.json"]
    assert "strnig" in schemas["refusals"][0]["error"]
    assert r["cold"]["output_tokens"] == r["unguided"]["output_tokens"] > 0  # the same tokens unguided
    assert r["warm"]["output_tokens"] > 0
    assert set(r["ratios"]) == {"cold_vs_unguided", "warm_vs_unguided"}
    for run in ("cold", "warm"):  # every step of a guided run has guided rows
        share = r[run]["mask_share"]
        assert share["steps"] > 0 and 0 < share["mean"] <= share["p99"] <= 1 and share["row_us"] > 0
        assert 0 <= share["parked"] <= 1
    assert r["unguided"]["mask_share"] == {"steps": 0, "mean": None, "p99": None, "row_us": None, "parked": None}
    compile_ms = r["compile_ms"]
    assert compile_ms["schemas"] == 4 and compile_ms["refused"] == 1
    assert {x["schema"] for x in compile_ms["per_schema"] if x["error"]} == {"schemas/bad_type.json"}
    assert all(compile_ms[k] is not None for k in ("p50", "p90", "p99", "max"))
    o = r["outputs"]
    assert o["accepted"] == 3
    assert o["stopped"] + o["cut_by_max_tokens"] + o["failed"] == o["accepted"]
    assert o["cut_inside_string"] <= o["cut_by_max_tokens"]
    assert o["parsed"] + len(o["details"]["unparsed"]) == o["stopped"]
    assert o["valid"] + o["invalid"] + o["not_validated"] == o["parsed"]
    assert o["invalid"] == 0
    assert "refused" in capsys.readouterr().out


def test_a_compile_timeout_is_a_refusal(tiny_llama_dir, schema_dir, tmp_path):
    r = run_bench(tiny_llama_dir, schema_dir, tmp_path, "--num-requests", "1", "--grammar-compile-timeout-s", "1e-6")
    assert (r["schemas"]["accepted"], r["schemas"]["refused"]) == (0, 1)
    assert all("timed out" in x["error"] for x in r["schemas"]["refusals"])
    assert r["cold"]["output_tokens"] == r["unguided"]["output_tokens"] == 0
    assert r["ratios"] == {"cold_vs_unguided": None, "warm_vs_unguided": None}
    assert r["compile_ms"]["refused"] == 1


def test_schemas_are_distinct_and_drawn_by_seed(schema_dir):
    (schema_dir / "point_again.json").write_text(json.dumps(SCHEMAS["point.json"]))
    drawn = load_schemas([schema_dir], 4, seed=3)
    assert len({json.dumps(x.schema, sort_keys=True) for x in drawn}) == 4
    assert [x.name for x in drawn] == [x.name for x in load_schemas([schema_dir], 4, seed=3)]
    assert {"type": "boolean"} in [x.schema for x in drawn]  # a MaskBench file's "schema"
    with pytest.raises(ValueError, match="4 distinct schemas"):
        load_schemas([schema_dir], 5, seed=0)


def test_agents_flags_are_refused_for_other_workloads(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "throughput", "--workload", "cpu", "--max-tokens", "8"])
    assert "--max-tokens apply to --workload agents only" in capsys.readouterr().err


def test_ends_inside_string():
    assert ends_inside_string('{"a": "unfinished')
    assert ends_inside_string('{"a": "x\\"y')
    assert not ends_inside_string('{"a": "done", "b": 1')
    assert not ends_inside_string('{"a": "x\\\\"')


def test_guided_runs_sample_the_same_outputs_every_time(tiny_llama_dir, schema_dir, tmp_path):
    """Each guided request has its own seed, so a second bench of the same code meets the same
    states (what makes two commits' runs comparable); the warm run's seeds differ from the cold's."""
    first, second = (run_bench(tiny_llama_dir, schema_dir, tmp_path, "--temperature", "1.0") for _ in range(2))
    for run in ("cold", "warm"):
        assert first[run]["output_tokens"] == second[run]["output_tokens"] > 0
    assert first["outputs"] == second["outputs"]
