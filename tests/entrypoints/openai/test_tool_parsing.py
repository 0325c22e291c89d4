"""Tool calls without a server: the plan and its constraint schema, parsing free text, following
constrained calls as they stream, and rendering tools and calls into prompts."""
import json

import pytest
from transformers import AutoTokenizer

from gdserve.entrypoints.openai.chat_render import render_chat
from gdserve.entrypoints.openai.errors import APIError
from gdserve.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from gdserve.entrypoints.openai.tool_parser import parse_tool_calls
from gdserve.entrypoints.openai.tool_stream import choice_tools
from gdserve.entrypoints.openai.tools import plan_tools
from tests.entrypoints.openai.conftest import CHATML

F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
G = {"type": "function", "function": {"name": "g", "description": "gee"}}


def _plan(**body):
    return plan_tools(ChatCompletionRequest(messages=[{"role": "user", "content": "q"}], **body))


@pytest.mark.parametrize("text,expected", [
    ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', [("f", '{"x": 1}')]),
    ('ok\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>{"name": "g", "parameters": "{\\"y\\": 2}"}',
     [("f", "{}"), ("g", '{"y": 2}')]),
    ('<tool_call>[{"name": "f", "arguments": {}}, {"function": {"name": "g", "arguments": "{}"}}]</tool_call>',
     [("f", "{}"), ("g", "{}")]),
    (' {"name": "f", "arguments": {"x": "é"}} ', [("f", '{"x": "é"}')]),
    ('```json\n[{"name": "g", "arguments": {}}]\n```', [("g", "{}")]),
    ('<tool_call>{"name": "h", "arguments": {}}</tool_call>', None),       # unknown function
    ('<tool_call>{"name": "f", "arguments": {"x": </tool_call>', None),     # broken JSON
    ('{"name": "f", "arguments": 3}', None),                                # arguments not an object
    ('{"name": "f", "arguments": {}} and more', None),
    ('{"x": 1}', None),
    ("The weather is fine.", None),
])
def test_parse_tool_calls(text, expected):
    assert parse_tool_calls(text, {"f", "g"}) == expected


def _run(handler, text: str, step: int) -> list[dict]:
    deltas = []
    for i in range(0, len(text), step):
        deltas += handler.feed(text[i:i + step])
    return deltas + handler.finish()


def _joined(deltas: list[dict]) -> tuple[str, dict[int, list]]:
    content, calls = "", {}
    for d in deltas:
        content += d.get("content", "")
        for t in d.get("tool_calls", []):
            if t["index"] not in calls:
                assert t["id"].startswith("call_") and t["function"]["arguments"] == ""
                calls[t["index"]] = [t["function"]["name"], ""]
            else:
                assert "id" not in t and "name" not in t["function"]
            calls[t["index"]][1] += t["function"]["arguments"]
    return content, calls


@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_required_calls_stream_in_pieces(step):
    text = ('[ {"name": "f", "arguments": {"name": "x", "arguments": [1, {"s": "}\\"]"}]}\n} ,'
            '{"name":"g","arguments": {} }]')
    handler = choice_tools(_plan(tools=[F, G], tool_choice="required"))
    content, calls = _joined(_run(handler, text, step))
    assert content == "" and handler.message()["content"] is None
    expected = [["f", '{"name": "x", "arguments": [1, {"s": "}\\"]"}]}'], ["g", "{}"]]
    assert [calls[0], calls[1]] == expected
    assert [[c["function"]["name"], c["function"]["arguments"]] for c in handler.message()["tool_calls"]] == expected
    assert handler.finish_reason("stop") == "tool_calls" and handler.finish_reason("length") == "length"


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_named_call_streams_stripped_arguments(step):
    handler = choice_tools(_plan(tools=[F, G], tool_choice={"type": "function", "function": {"name": "f"}}))
    _, calls = _joined(_run(handler, ' \n{"x" : 4}\n ', step))
    assert calls == {0: ["f", '{"x" : 4}']}


@pytest.mark.parametrize("step", [1, 4, 1000])
@pytest.mark.parametrize("text,content,calls", [
    ('Let me check. <tool_call>{"name": "f", "arguments": {"x": 2}}</tool_call>', "Let me check. ",
     {0: ["f", '{"x": 2}']}),
    ('{"name": "g", "arguments": {}}', "", {0: ["g", "{}"]}),
    ("a <tool b <tool_c", "a <tool b <tool_c", {}),
    ('{"answer": 42}', '{"answer": 42}', {}),
    ('<tool_call>{"name": "nope"}</tool_call>', '<tool_call>{"name": "nope"}</tool_call>', {}),
])
def test_auto_streams_content_and_holds_calls(step, text, content, calls):
    handler = choice_tools(_plan(tools=[F, G]))
    assert _joined(_run(handler, text, step)) == (content, calls)
    message = handler.message()
    assert message["content"] == (content or None if calls else content)
    assert handler.finish_reason("stop") == ("tool_calls" if calls else "stop")


def test_auto_without_parallel_calls_keeps_the_first():
    handler = choice_tools(_plan(tools=[F, G], parallel_tool_calls=False))
    _run(handler, '<tool_call>{"name": "g", "arguments": {}}</tool_call><tool_call>{"name": "f", "arguments": {}}', 5)
    assert [c["function"]["name"] for c in handler.message()["tool_calls"]] == ["g"]


def test_plan_schemas():
    named = _plan(tools=[F, G], tool_choice={"type": "function", "function": {"name": "g"}})
    assert named.mode == "named" and named.schema() == {"type": "object", "properties": {}}
    one = _plan(tools=[F, G], tool_choice="required", parallel_tool_calls=False).schema()
    assert [b["properties"]["name"] for b in one["anyOf"]] == [{"const": "f"}, {"const": "g"}]
    assert one["anyOf"][0]["properties"]["arguments"]["properties"] == F["function"]["parameters"]["properties"]
    many = _plan(tools=[F], tool_choice="required").schema()
    assert many["type"] == "array" and many["minItems"] == 1 and many["items"]["properties"]["name"] == {"const": "f"}
    assert _plan(tools=[F]).mode == "auto" and _plan(tools=[F], tool_choice="none").mode == "none"
    assert _plan(tools=[F], response_format={"type": "json_object"}).mode == "none"
    assert _plan(tool_choice="auto") is None


@pytest.mark.parametrize("parameters,words", [
    ({"type": "objekt"}, ["'objekt'"]), ([1], ["list"]), ({"properties": {"a": 3}}, ["/properties/a"]),
    ({"required": "a"}, ["/required"]), ({"anyOf": {}}, ["/anyOf"]),
])
def test_invalid_parameters_are_named(parameters, words):
    with pytest.raises(APIError) as e:
        _plan(tools=[F, {"type": "function", "function": {"name": "bad", "parameters": parameters}}])
    assert e.value.status == 400 and "tools[1]" in e.value.message and "'bad'" in e.value.message
    for word in words:
        assert word in e.value.message


def test_pydantic_parameters_with_defs_compile_inside_the_required_schema(smollm2_dir):
    from pydantic import BaseModel

    from gdserve.grammar import compile_grammar

    class Address(BaseModel):
        city: str

    class Person(BaseModel):
        name: str
        address: Address

    tool = {"type": "function", "function": {"name": "person", "parameters": Person.model_json_schema()}}
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    grammar = compile_grammar("json", _plan(tools=[F, tool], tool_choice="required").schema(), tokenizer)
    for text, ok in [('[{"name": "person", "arguments": {"name": "A", "address": {"city": "B"}}}]', True),
                     ('[{"name": "f", "arguments": {"name": "A", "address": {"city": "B"}}}]', False)]:
        matcher = grammar.matcher()
        accepted = all(matcher.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))
        assert (accepted and matcher.is_terminated()) == ok


HISTORY = [ChatMessage(role="user", content="w?"),
           ChatMessage(role="assistant", content=None, tool_calls=[
               {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]),
           ChatMessage(role="tool", tool_call_id="call_1", content="sunny")]


def test_render_fallback_writes_tools_and_calls(tiny_llama_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    plan = _plan(tools=[F, G])
    text = render_chat(tokenizer, CHATML, HISTORY, plan)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n") and '"name": "g", "description": "gee"' in system
    assert "<tool_call>" in system
    assert '<|im_start|>assistant\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\nsunny<|im_end|>" in text
    # "none": the template can't take tools, so they stay out of the prompt
    assert render_chat(tokenizer, CHATML, HISTORY, _plan(tools=[F], tool_choice="none")).startswith("<|im_start|>user")


def test_render_tool_messages_as_user_when_the_template_refuses_the_role(tiny_llama_dir):
    strict = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
              "{{ raise_exception('bad role') }}{% endif %}{{ m['role'] + ':' + m['content'] + '\\n' }}{% endfor %}")
    text = render_chat(AutoTokenizer.from_pretrained(tiny_llama_dir), strict, HISTORY, None)
    assert "user:<tool_response>sunny</tool_response>" in text
