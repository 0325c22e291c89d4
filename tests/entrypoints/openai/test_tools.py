"""tools / tool_choice over HTTP on the tiny model (a template that takes `tools=`): forced calls
are valid against their schemas, streamed calls equal non-streamed ones, bad tools are 400s."""
import json

import jsonschema
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                                     "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                                  "b": {"type": "boolean"}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSG = [{"role": "user", "content": "hi"}]


def _chat(server, **body) -> dict:
    status, response = server.post("/v1/chat/completions", {"messages": MSG, "max_tokens": 48, "temperature": 0,
                                                            "tools": TOOLS, **body})
    assert status == 200, response
    return response


def _assert_calls(choice: dict, names: set[str], count: int | None = 1) -> list[dict]:
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls", choice
    assert message["content"] is None
    calls = message["tool_calls"]
    assert count is None or len(calls) == count
    for call in calls:
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"]["name"] in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    assert len({c["id"] for c in calls}) == len(calls)
    return calls


def test_named_tool_choice(tiny_tools_server):
    r = _chat(tiny_tools_server, tool_choice={"type": "function", "function": {"name": "add"}}, n=2, seed=3,
              temperature=1.0)
    for choice in r["choices"]:
        _assert_calls(choice, {"add"})


@pytest.mark.parametrize("parallel", [False, True])
def test_required_tool_choice(tiny_tools_server, parallel):
    r = _chat(tiny_tools_server, tool_choice="required", parallel_tool_calls=parallel, seed=1, temperature=0.8,
              max_tokens=80)
    _assert_calls(r["choices"][0], {"get_weather", "add"}, 1 if not parallel else None)


def test_none_ignores_tools_for_generation(tiny_tools_server):
    r = _chat(tiny_tools_server, tool_choice="none", max_tokens=8)
    assert r["choices"][0]["finish_reason"] != "tool_calls"
    assert r["choices"][0]["message"]["tool_calls"] == []
    assert isinstance(r["choices"][0]["message"]["content"], str)
    # the template got the tools: the prompt is longer than without them
    plain = tiny_tools_server.post("/v1/chat/completions", {"messages": MSG, "max_tokens": 1})[1]
    extra = "<|im_start|>system\nget_weather add <|im_end|>\n"
    assert r["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + _byte_tokens(extra)


def _byte_tokens(text: str) -> int:
    """Tokens of text under the tiny model's byte tokenizer (the two specials are one token each)."""
    return len(text.encode()) - 11 * text.count("<|im_start|>") - 9 * text.count("<|im_end|>")


def _streamed(server, **body) -> tuple[list[dict], str]:
    client = server.client()
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(model=server.model, messages=MSG, tools=TOOLS, stream=True,
                                                temperature=0, max_tokens=60, **body):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id.startswith("call_") and d.function.name, d
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and d.function.name is None
            calls[d.index]["arguments"] += d.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_stream_equals_non_streamed(tiny_tools_server, choice):
    streamed, finish = _streamed(tiny_tools_server, tool_choice=choice, parallel_tool_calls=False)
    whole = _chat(tiny_tools_server, tool_choice=choice, parallel_tool_calls=False, max_tokens=60)["choices"][0]
    assert finish == whole["finish_reason"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in streamed] == \
           [(c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]]


def test_history_with_tool_calls_and_tool_messages(tiny_tools_server):
    args = '{"city": "Oslo", "unit": "c"}'
    messages = [{"role": "user", "content": "w?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "-3"}]
    r = tiny_tools_server.client().chat.completions.create(model=tiny_tools_server.model, messages=messages,
                                                           tools=TOOLS, max_tokens=2)
    # the template wrote the call (name + arguments as an object) into the prompt
    expected = ('<|im_start|>system\nget_weather add <|im_end|>\n<|im_start|>user\nw?<|im_end|>\n'
                '<|im_start|>assistant\nget_weather{"city": "Oslo", "unit": "c"}<|im_end|>\n'
                '<|im_start|>tool\n-3<|im_end|>\n<|im_start|>assistant\n')
    assert r.usage.prompt_tokens == _byte_tokens(expected)


def test_recursive_parameters_are_constrained(tiny_tools_server):
    tree = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                             "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
            "required": ["name", "kids"], "additionalProperties": False}
    tools = [WEATHER, {"type": "function", "function": {"name": "tree", "parameters": tree}}]
    for choice in ({"type": "function", "function": {"name": "tree"}}, "required"):
        r = _chat(tiny_tools_server, tools=tools, tool_choice=choice, parallel_tool_calls=False, max_tokens=80)
        assert r["choices"][0]["finish_reason"] == "tool_calls", r
        call, = r["choices"][0]["message"]["tool_calls"]
        schema = tree if call["function"]["name"] == "tree" else WEATHER["function"]["parameters"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)


def _error(server, **body) -> dict:
    status, response = server.post("/v1/chat/completions", {"messages": MSG, "max_tokens": 4, **body})
    assert status == 400, response
    return response["error"]


def test_tool_errors_are_400(tiny_tools_server):
    s = tiny_tools_server
    e = _error(s, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "nope" in e["message"] and e["param"] == "tool_choice"
    bad = {"type": "function", "function": {"name": "bad", "parameters": {"type": "objekt"}}}
    e = _error(s, tools=[WEATHER, bad])
    assert "tools[1]" in e["message"] and "objekt" in e["message"] and e["param"] == "tools"
    looping = {"type": "function", "function": {"name": "loop", "parameters": {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}}
    for choice in ("required", {"type": "function", "function": {"name": "loop"}}):
        e = _error(s, tools=[WEATHER, looping], tool_choice=choice)
        assert "tools[1]" in e["message"] and "'loop'" in e["message"] and "cycle" in e["message"], e
    e = _error(s, tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})
    assert "response_format" in e["message"] and e["param"] == "tool_choice"
    e = _error(s, tools=TOOLS, tool_choice="auto", guided_regex="a+")
    assert "guided_regex" in e["message"]
    assert "needs tools" in _error(s, tool_choice="required")["message"]
    assert "more than once" in _error(s, tools=[ADD, ADD])["message"]
    assert "function tools" in _error(s, tools=[{"type": "code_interpreter"}])["message"]
    assert "tool_choice" in _error(s, tools=TOOLS, tool_choice="sometimes")["message"]
    assert "function.name" in _error(s, tools=[{"type": "function", "function": {"name": "a b"}}])["message"]


def test_tools_without_tool_choice_beside_a_constraint(tiny_tools_server):
    r = _chat(tiny_tools_server, guided_choice=["yes", "no"])
    assert r["choices"][0]["message"]["content"] in ("yes", "no")
    assert r["choices"][0]["message"]["tool_calls"] == []
