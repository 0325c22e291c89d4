"""Bad input gets an OpenAI error JSON with the right status, never a 500 or a hang."""
import time

import openai
import pytest

MSG = [{"role": "user", "content": "hi"}]


def _chat(server, **body) -> tuple[int, dict]:
    return server.post("/v1/chat/completions", {"model": server.model, "messages": MSG, "max_tokens": 4, **body})


def _assert_error(status: int, body: dict, expected: int, *words: str, param: str | None = None) -> None:
    assert status == expected, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], (word, error["message"])
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("field,value", [("temperature", -1), ("top_p", 0), ("n", 0), ("max_tokens", 0),
                                         ("presence_penalty", 5), ("top_k", -5), ("logit_bias", {"x": 1})])
def test_bad_values_are_400(tiny_server, field, value):
    status, body = _chat(tiny_server, **{field: value})
    _assert_error(status, body, 400, field.split("_bias")[0])


def test_bad_requests_are_400(tiny_server):
    s = tiny_server
    _assert_error(*_chat(s, max_tokens=10_000), 400, "max_model_len")
    _assert_error(*s.post("/v1/completions", {"prompt": "x" * 300, "max_tokens": 1}), 400, "300 tokens", param="prompt")
    _assert_error(*s.post("/v1/completions", {"prompt": [999999], "max_tokens": 1}), 400, "vocabulary")
    _assert_error(*s.post("/v1/completions", {"prompt": "x", "suffix": "y"}), 400, "suffix", param="suffix")
    _assert_error(*s.post("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1}), 400, "echo")
    _assert_error(*_chat(s, top_logprobs=2), 400, "logprobs")
    _assert_error(*_chat(s, stream_options={"include_usage": True}), 400, "stream", param="stream_options")
    _assert_error(*_chat(s, tools=[{"type": "function", "function": {"name": "f"}}],
                         tool_choice={"type": "function", "function": {"name": "g"}}), 400, "'g'", param="tool_choice")
    _assert_error(*_chat(s, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
                  400, "image_url")
    _assert_error(*s.post("/v1/embeddings", {"input": []}), 400, "empty")


def test_bad_constraints_are_400(tiny_server):
    s = tiny_server
    _assert_error(*_chat(s, guided_regex="[0-9]+", guided_choice=["a"]), 400, "guided_regex", "guided_choice")
    _assert_error(*_chat(s, guided_json={"type": "string"}, response_format={"type": "json_object"}), 400,
                  "at most one")
    _assert_error(*_chat(s, guided_regex="(?<=a)b"), 400, "look", param="guided_regex")
    _assert_error(*_chat(s, guided_json={"type": "object", "properties": {"a": {"not": {"pattern": "^a"}}}}),
                  400, "'not'", "/properties/a", param="guided_json")
    _assert_error(*_chat(s, guided_json="{not json"), 400, "not valid JSON")
    _assert_error(*_chat(s, guided_grammar="start: 'a'"), 400, "invalid Lark grammar", param="guided_grammar")
    _assert_error(*_chat(s, structured_outputs={"regex": "a", "choice": ["b"]}), 400, "exactly one")
    _assert_error(*_chat(s, guided_regex="a+", guided_whitespace_pattern=" "), 400, "whitespace")
    _assert_error(*_chat(s, response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400, "schema")


def test_malformed_bodies_are_422(tiny_server):
    s = tiny_server
    _assert_error(*s.post("/v1/chat/completions", b'{"messages": ['), 422, "not valid JSON")
    _assert_error(*s.post("/v1/chat/completions", {"model": s.model}), 422, "messages")
    _assert_error(*_chat(s, temperature="hot"), 422, "temperature", param="temperature")
    _assert_error(*_chat(s, messages=[{"role": "wizard", "content": "x"}]), 422, "role")
    _assert_error(*_chat(s, response_format={"type": "xml"}), 422, "response_format")


def test_unknown_model_is_404(tiny_server):
    with pytest.raises(openai.NotFoundError) as e:
        tiny_server.client().chat.completions.create(model="gpt-9", messages=MSG)
    assert "gpt-9" in str(e.value) and e.value.body["param"] == "model"


def test_server_survives_bad_requests(tiny_server):
    r = tiny_server.client().completions.create(model=tiny_server.model, prompt="ok", max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert tiny_server.metric("gdserve_kv_cache_used_blocks") == 0


def test_api_key_is_required(guarded_server):
    s = guarded_server
    with pytest.raises(openai.AuthenticationError):
        s.client(api_key="wrong").models.list()
    status, body = s.post("/v1/models", {}, headers={"Authorization": ""})
    _assert_error(status, body, 401, "API key")
    assert [m.id for m in s.client().models.list().data] == [s.model]
    assert s.get("/health") == ""  # health and metrics stay open


def test_queue_full_is_429(guarded_server):
    s = guarded_server
    client = s.client()
    long = client.chat.completions.create(model=s.model, messages=MSG, max_tokens=2000, stream=True,
                                          extra_body={"ignore_eos": True})
    next(iter(long))  # the request is in flight
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model=s.model, messages=MSG, max_tokens=2)
    assert "limit" in str(e.value)
    long.close()
    deadline = time.monotonic() + 20
    while s.metric("gdserve_num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    r = client.chat.completions.create(model=s.model, messages=MSG, max_tokens=2)
    assert r.choices[0].message.content is not None
