"""The prefix key the router reads: the model and the start of the prompt, nothing else."""
import json

from gdserve.entrypoints.ray_serve.forward import ResponseStart, prefix_key


def chat(*messages: str, model: str = "m", **extra) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": m} for m in messages],
                       **extra}).encode()


def test_requests_that_share_a_prefix_share_a_key():
    shared = "You are a careful assistant. " * 4
    assert prefix_key(chat(shared + "one"), 64) == prefix_key(chat(shared + "two"), 64)
    assert prefix_key(chat(shared + "one"), 64) != prefix_key(chat("other" + shared), 64)


def test_the_model_and_the_tools_are_part_of_the_key():
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert prefix_key(chat("hi", model="a"), 64) != prefix_key(chat("hi", model="b"), 64)
    assert prefix_key(chat("hi", tools=[tool]), 64) != prefix_key(chat("hi"), 64)


def test_completion_prompts_token_ids_and_multimodal_parts_have_keys():
    completion = lambda prompt: json.dumps({"model": "m", "prompt": prompt}).encode()  # noqa: E731
    assert prefix_key(completion("abc"), 64) == prefix_key(completion(["abc", "zzz"]), 64)
    assert prefix_key(completion([1, 2, 3]), 64) is not None
    parts = json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    assert prefix_key(parts.encode(), 64) == prefix_key(chat("hi"), 64)


def test_no_key_without_a_prompt_or_with_affinity_off():
    assert prefix_key(b"", 64) is None
    assert prefix_key(b"not json", 64) is None
    assert prefix_key(b"[1, 2]", 64) is None
    assert prefix_key(json.dumps({"model": "m"}).encode(), 64) is None
    assert prefix_key(chat("hi"), 0) is None


def test_an_event_stream_is_told_by_its_content_type():
    assert ResponseStart(200, [(b"content-type", b"text/event-stream; charset=utf-8")]).is_event_stream
    assert not ResponseStart(200, [(b"content-type", b"application/json")]).is_event_stream
