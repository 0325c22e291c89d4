"""The json dataset: a JSONL (or a JSON list) of {"prompt", "max_tokens"}, in file order or
sampled with the seed, and bad lines refused naming the line."""
import pytest

from gdserve.bench.datasets.prompt_file import PromptEntry, load_prompts, prompt_requests


def encode(text: str) -> list[int]:
    return list(text.encode())


@pytest.fixture
def prompt_file(tmp_path):
    def write(content: str, name: str = "prompts.jsonl") -> str:
        path = tmp_path / name
        path.write_text(content)
        return str(path)
    return write


def test_jsonl_in_file_order(prompt_file):
    path = prompt_file('{"prompt": "one", "max_tokens": 5}\n\n{"prompt": "two", "max_tokens": 7, "x": 1}\n')
    assert load_prompts(path) == [PromptEntry("one", 5), PromptEntry("two", 7)]
    requests = prompt_requests(load_prompts(path), encode)
    assert [(bytes(r.prompt_token_ids).decode(), r.expected_output_len) for r in requests] == [("one", 5), ("two", 7)]


def test_a_json_list_too(prompt_file):
    path = prompt_file('[{"prompt": "one", "max_tokens": 5},\n {"prompt": "two", "max_tokens": 7}]', "p.json")
    assert load_prompts(path) == [PromptEntry("one", 5), PromptEntry("two", 7)]


def test_output_len_overrides_max_tokens_and_may_stand_in_for_it(prompt_file):
    path = prompt_file('{"prompt": "one"}\n{"prompt": "two", "max_tokens": 7}\n')
    requests = prompt_requests(load_prompts(path, need_max_tokens=False), encode, output_len=3)
    assert [r.expected_output_len for r in requests] == [3, 3]


def test_num_prompts_samples_with_the_seed_and_repeats_beyond_the_file():
    entries = [PromptEntry(f"prompt {i}", 4 + i) for i in range(20)]
    first = prompt_requests(entries, encode, num_prompts=5, seed=4)
    assert first == prompt_requests(entries, encode, num_prompts=5, seed=4)
    assert len({tuple(r.prompt_token_ids) for r in first}) == 5
    assert first != prompt_requests(entries, encode, num_prompts=5, seed=5)
    more = prompt_requests(entries[:3], encode, num_prompts=7)
    assert len(more) == 7 and len({tuple(r.prompt_token_ids) for r in more}) == 3


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "fine", "max_tokens": 3}\n{"max_tokens": 3}\n', r"line 2: expected \{\"prompt\": str"),
    ('{"prompt": "fine", "max_tokens": 3}\n{"prompt": "cut\n', "line 2: not valid JSON"),
    ('{"prompt": "no budget"}\n', "line 1: no max_tokens"),
    ('{"prompt": "zero", "max_tokens": 0}\n', "line 1: max_tokens must be an integer >= 1, got 0"),
    ('{"prompt": "text", "max_tokens": "8"}\n', "max_tokens must be an integer >= 1, got '8'"),
    ('["just a string"]', r"entry 0: expected \{\"prompt\": str"),
    ("\n\n", "no prompt in the file"),
])
def test_bad_lines_are_refused_naming_the_line(prompt_file, content, message):
    with pytest.raises(ValueError, match=message):
        load_prompts(prompt_file(content))
