"""The ShareGPT dataset: a conversation's first two turns, vLLM's length filters, a seeded
sample, and bad files refused in one line. Token ids here are a text's bytes."""
import json

import pytest

from gdserve.bench.datasets.sharegpt import load_sharegpt, sharegpt_requests


def encode(text: str) -> list[int]:
    return list(text.encode())


def conversation(*values: str) -> dict:
    return {"conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": v} for i, v in enumerate(values)]}


@pytest.fixture
def sharegpt_file(tmp_path):
    def write(data) -> str:
        path = tmp_path / "sharegpt.json"
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        return str(path)
    return write


def test_the_first_two_turns_are_the_prompt_and_its_length(sharegpt_file):
    path = sharegpt_file([conversation("What is up?", "The sky.", "And below?", "The ground, mostly."),
                          conversation("alone"), {"id": "no conversations"}, conversation("Hello there", "Hi you")])
    assert load_sharegpt(path) == [("What is up?", "The sky."), ("Hello there", "Hi you")]
    requests = sharegpt_requests(load_sharegpt(path), encode, num_prompts=2)
    assert sorted((bytes(r.prompt_token_ids).decode(), r.expected_output_len) for r in requests) == \
        [("Hello there", 6), ("What is up?", 8)]


@pytest.mark.parametrize("prompt, completion, kept", [
    ("abc", "long enough", False),             # prompt under 4 tokens
    ("abcd", "abc", False),                    # output under 4 tokens
    ("abcd", "abcd", True),
    ("x" * 1024, "y" * 1024, True),            # at both limits
    ("x" * 1025, "y" * 8, False),              # prompt over 1024
    ("x" * 1000, "y" * 1049, False),           # prompt + output over 2048
])
def test_vllm_length_filters(prompt, completion, kept):
    requests = sharegpt_requests([(prompt, completion), ("kept prompt", "kept answer")], encode, num_prompts=2)
    assert (prompt.encode() in [bytes(r.prompt_token_ids) for r in requests]) == kept


def test_output_len_overrides_the_answer_and_lifts_its_minimum():
    pairs = [("abcd", "ab"), ("efgh", "a much longer answer")]
    requests = sharegpt_requests(pairs, encode, num_prompts=2, output_len=3)
    assert sorted(bytes(r.prompt_token_ids).decode() for r in requests) == ["abcd", "efgh"]
    assert {r.expected_output_len for r in requests} == {3}


def test_a_seeded_sample_of_num_prompts():
    pairs = [(f"prompt number {i}", f"answer number {i}") for i in range(50)]
    first = sharegpt_requests(pairs, encode, num_prompts=10, seed=1)
    assert first == sharegpt_requests(pairs, encode, num_prompts=10, seed=1)
    assert first != sharegpt_requests(pairs, encode, num_prompts=10, seed=2)
    assert len(first) == len({tuple(r.prompt_token_ids) for r in first}) == 10
    assert [bytes(r.prompt_token_ids).decode() for r in first] != [p for p, _ in pairs[:10]]  # shuffled


def test_too_few_conversations_are_repeated_up_to_num_prompts():
    pairs = [(f"prompt {i}", f"answer {i}") for i in range(3)]
    requests = sharegpt_requests(pairs, encode, num_prompts=8)
    assert len(requests) == 8 and len({tuple(r.prompt_token_ids) for r in requests}) == 3


@pytest.mark.parametrize("content, message", [
    ('[{"conversations": [', "not valid JSON"),
    ('{"conversations": []}', "a JSON list of conversations, got a dict"),
    ('[{"conversations": [{"value": "hi"}, {"value": 3}]}]', "entry 0: its first two turns need a string 'value'"),
    ('[{"conversations": [{"value": "only one turn"}]}]', "no conversation with two turns"),
])
def test_bad_files_are_refused_naming_the_problem(sharegpt_file, content, message):
    with pytest.raises(ValueError, match=message):
        load_sharegpt(sharegpt_file(content))


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_sharegpt(str(tmp_path / "absent.json"))


def test_no_conversation_within_the_filters_is_refused():
    with pytest.raises(ValueError, match="passes the length filters"):
        sharegpt_requests([("ab", "cd")], encode, num_prompts=1)
