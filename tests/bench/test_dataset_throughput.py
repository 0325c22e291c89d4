"""`gdserve bench throughput --dataset-name ...` through the CLI: vLLM's JSON fields, consistent
with each other, from a run on the tiny model; and every bad input refused in one line with exit
status 2."""
import json

import pytest

from gdserve.entrypoints.cli import main
from tests.bench.conftest import ENGINE_FLAGS

VLLM_FIELDS = ("elapsed_time", "num_requests", "total_num_tokens", "requests_per_second", "tokens_per_second")


def test_random_dataset_run_writes_vllm_fields(tiny_llama_dir, tmp_path, capsys):
    output = tmp_path / "throughput.json"
    main(["bench", "throughput", str(tiny_llama_dir), "--dataset-name", "random", "--input-len", "10",
          "--output-len", "6", "--prefix-len", "2", "--num-prompts", "5", "--seed", "3", "--output", str(output),
          *ENGINE_FLAGS])
    r = json.loads(output.read_text())
    assert set(VLLM_FIELDS) <= set(r) and {"command", "date", "commit", "machine", "device"} <= set(r)
    assert r["num_requests"] == 5
    assert r["total_prompt_tokens"] == 5 * 12 and r["total_output_tokens"] == 5 * 6  # EOS ignored
    assert r["total_num_tokens"] == r["total_prompt_tokens"] + r["total_output_tokens"]
    assert r["tokens_per_second"] * r["elapsed_time"] == pytest.approx(r["total_num_tokens"])
    assert r["requests_per_second"] * r["elapsed_time"] == pytest.approx(5)
    assert r["output_tokens_per_second"] * r["elapsed_time"] == pytest.approx(30)
    assert r["dataset"] == {"dataset_name": "random", "dataset_path": None, "num_prompts": 5, "input_len": 10,
                            "output_len": 6, "range_ratio": 0.0, "prefix_len": 2, "seed": 3}
    captured = capsys.readouterr()
    assert "Throughput:" in captured.out and "output tokens/s" in captured.out
    assert "Processed prompts" not in captured.err  # no progress bar off a terminal


def test_sharegpt_run_counts_the_conversations_tokens(tiny_llama_dir, tmp_path, capsys):
    """The tiny model's tokenizer has a token per byte and adds none: each count is a length in bytes."""
    turns = [("Tell me a story.", "Once upon a time."), ("What is two plus two?", "Four, I think."), ("hi", "hello")]
    data = [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]} for q, a in turns]
    (tmp_path / "sharegpt.json").write_text(json.dumps(data))
    output = tmp_path / "throughput.json"
    main(["bench", "throughput", str(tiny_llama_dir), "--dataset-path", str(tmp_path / "sharegpt.json"),
          "--num-prompts", "2", "--output-json", str(output), *ENGINE_FLAGS])
    r = json.loads(output.read_text())
    assert r["dataset"]["dataset_name"] == "sharegpt" and r["num_requests"] == 2
    assert r["total_prompt_tokens"] == sum(len(q) for q, _ in turns[:2])  # "hi" is under 4 tokens: filtered
    assert r["total_output_tokens"] == sum(len(a) for _, a in turns[:2])


@pytest.fixture
def files(tmp_path):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hello", "max_tokens": 3}\n{"max_tokens": 3}\n')
    (tmp_path / "broken.json").write_text('[{"conversations": [')
    return tmp_path


@pytest.mark.parametrize("flags, message", [
    (["--dataset-name", "sharegpt"], "--dataset-name sharegpt needs --dataset-path"),
    (["--dataset-name", "json", "--dataset-path", "{dir}/absent.jsonl"], "absent.jsonl: no such file"),
    (["--dataset-path", "{dir}/broken.json"], "broken.json: not valid JSON"),
    (["--dataset-path", "{dir}/prompts.jsonl"], 'prompts.jsonl: line 2: expected {"prompt": str'),
    (["--dataset-name", "random"], "--dataset-name random needs --input-len"),
    (["--dataset-name", "random", "--input-len", "8", "--dataset-path", "{dir}/prompts.jsonl"],
     "--dataset-path does not apply to --dataset-name random"),
    (["--dataset-name", "json", "--dataset-path", "{dir}/prompts.jsonl", "--range-ratio", "0.1"],
     "--dataset-name json takes no --range-ratio"),
    (["--input-len", "8", "--range-ratio", "1.5"], "--range-ratio must be in [0, 1)"),
    (["--input-len", "8", "--num-prompts", "0"], "--num-prompts must be >= 1"),
    (["--workload", "cpu", "--dataset-name", "random", "--input-len", "8"],
     "--dataset-name and --workload cpu both pick the requests"),
    (["--workload", "random", "--input-len", "8"], "--input-len and --workload random both pick the requests"),
    (["--input-len", "8", "--num-requests", "4"], "--num-requests does not apply to a dataset"),
    (["--input-len", "8", "--lora", "2"], "--lora does not apply to a dataset"),
    (["--workload", "cpu", "--seed", "1"], "--seed applies to --workload agents and to the datasets"),
])
def test_bad_input_is_one_line_and_exit_status_2(tiny_llama_dir, files, flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "throughput", str(tiny_llama_dir), *[f.format(dir=files) for f in flags], *ENGINE_FLAGS])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
