"""OpenAI's `strict` through the openai SDK: a schema with a keyword gdserve cannot enforce exactly is a
400 naming keyword and pointer unless its `strict` is false; then the answer is valid JSON and says
what was relaxed in structured_output_relaxed (model_extra to the SDK), streamed or not."""
import json

import jsonschema
import openai
import pytest

# format 'idn-hostname' has no exact pattern: refused exactly, dropped leniently
HOST = {"type": "object", "properties": {"host": {"type": "string", "format": "idn-hostname", "maxLength": 8}},
        "required": ["host"], "additionalProperties": False}
HOST_RELAXED = ["format 'idn-hostname' at /properties/host"]
EXACT = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
         "additionalProperties": False}
MSG = [{"role": "user", "content": "hi"}]
RELAXED = "structured_output_relaxed"


def _format(schema: dict, strict: bool | None) -> dict:
    spec = {"name": "host", "schema": schema} | ({} if strict is None else {"strict": strict})
    return {"type": "json_schema", "json_schema": spec}


def _raw_chat(server, **kw):
    """(the parsed response or stream, the X-Structured-Output-Relaxed header or None)."""
    raw = server.client().chat.completions.with_raw_response.create(
        model=server.model, messages=MSG, max_tokens=40, seed=0, temperature=1.0, **kw)
    return raw.parse(), raw.headers.get("x-structured-output-relaxed")


def _chat(server, **kw):
    return _raw_chat(server, **kw)[0]


@pytest.mark.parametrize("strict", [True, None])
def test_exact_schema_refuses_what_it_cannot_enforce(tiny_server, strict):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(tiny_server, response_format=_format(HOST, strict))
    error = e.value.body
    assert "format 'idn-hostname' at /properties/host" in error["message"], error
    assert error["param"] == "response_format"


def test_strict_false_relaxes_and_says_what(tiny_server):
    r, header = _raw_chat(tiny_server, response_format=_format(HOST, False))
    jsonschema.validate(json.loads(r.choices[0].message.content), HOST)  # formats are not asserted
    assert r.model_extra[RELAXED] == {"response_format.json_schema.schema": HOST_RELAXED}
    assert header == "1"
    stream, header = _raw_chat(tiny_server, response_format=_format(HOST, False), stream=True)
    chunks = list(stream)
    assert header == "1"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), HOST)
    assert chunks[0].model_extra[RELAXED] == {"response_format.json_schema.schema": HOST_RELAXED}
    assert all(RELAXED not in (c.model_extra or {}) for c in chunks[1:])  # once, in the first chunk
    completion = tiny_server.client().completions.create(model=tiny_server.model, prompt="x", max_tokens=40,
                                                         extra_body={"response_format": _format(HOST, False)})
    jsonschema.validate(json.loads(completion.choices[0].text), HOST)
    assert completion.model_extra[RELAXED] == {"response_format.json_schema.schema": HOST_RELAXED}


def test_relaxed_field_only_with_strict_false(tiny_server):
    lenient, header = _raw_chat(tiny_server, response_format=_format(EXACT, False))
    assert lenient.model_extra[RELAXED] == {"response_format.json_schema.schema": []}  # enforced as written
    assert header == "0"
    for strict in (True, None):
        exact, header = _raw_chat(tiny_server, response_format=_format(EXACT, strict))
        jsonschema.validate(json.loads(exact.choices[0].message.content), EXACT)
        assert RELAXED not in (exact.model_extra or {}) and header is None
    json_object, header = _raw_chat(tiny_server, response_format={"type": "json_object"})
    assert RELAXED not in (json_object.model_extra or {}) and header is None


def test_strict_must_be_a_boolean(tiny_server, tiny_tools_server):
    with pytest.raises(openai.UnprocessableEntityError) as e:
        _chat(tiny_server, response_format=_format(EXACT, "yes"))
    assert e.value.body["param"] == "response_format.json_schema.strict", e.value.body
    tool = {"type": "function", "function": {"name": "f", "parameters": EXACT, "strict": "yes"}}
    with pytest.raises(openai.BadRequestError) as e:
        _chat(tiny_tools_server, tools=[tool])
    assert "tools[0].function.strict" in e.value.body["message"] and e.value.body["param"] == "tools"


def _tool(name: str, parameters: dict, strict: bool | None) -> dict:
    function = {"name": name, "parameters": parameters} | ({} if strict is None else {"strict": strict})
    return {"type": "function", "function": function}


NAMED = {"type": "function", "function": {"name": "lookup"}}


@pytest.mark.parametrize("strict", [True, None])
@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_exact_tool_refuses_what_it_cannot_enforce(tiny_tools_server, strict, tool_choice):
    tools = [_tool("ok", EXACT, None), _tool("lookup", HOST, strict)]
    with pytest.raises(openai.BadRequestError) as e:
        _chat(tiny_tools_server, tools=tools, tool_choice=tool_choice)
    message = e.value.body["message"]
    assert "tools[1].function.parameters" in message and "'lookup'" in message, message
    assert "format 'idn-hostname' at /properties/host" in message, message


def _arguments(call) -> dict:
    return json.loads(call.function.arguments)


def test_tool_with_strict_false_relaxes_and_says_what(tiny_tools_server):
    tools = [_tool("ok", EXACT, True), _tool("lookup", HOST, False)]
    r = _chat(tiny_tools_server, tools=tools, tool_choice=NAMED)
    call, = r.choices[0].message.tool_calls
    assert call.function.name == "lookup"
    jsonschema.validate(_arguments(call), HOST)
    assert r.model_extra[RELAXED] == {"tools[1].function.parameters": HOST_RELAXED}
    chunks = list(_chat(tiny_tools_server, tools=tools, tool_choice=NAMED, stream=True))
    arguments = "".join(d.function.arguments or "" for c in chunks if c.choices
                        for d in c.choices[0].delta.tool_calls or [])
    jsonschema.validate(json.loads(arguments), HOST)
    assert chunks[0].model_extra[RELAXED] == {"tools[1].function.parameters": HOST_RELAXED}
    assert all(RELAXED not in (c.model_extra or {}) for c in chunks[1:])


def test_required_mixes_strict_and_lenient_tools(tiny_tools_server):
    tools = [_tool("ok", EXACT, None), _tool("lookup", HOST, False)]
    for seed in range(3):
        r = tiny_tools_server.client().chat.completions.create(
            model=tiny_tools_server.model, messages=MSG, max_tokens=80, seed=seed, temperature=1.0, tools=tools,
            tool_choice="required", parallel_tool_calls=False)
        call, = r.choices[0].message.tool_calls
        jsonschema.validate(_arguments(call), {"ok": EXACT, "lookup": HOST}[call.function.name])
        assert r.model_extra[RELAXED] == {"tools[1].function.parameters": HOST_RELAXED}  # only the lenient one
    # a strict function beside a lenient one is still exact: its refusal names it
    tools = [_tool("ok", EXACT, False), _tool("lookup", HOST, True)]
    with pytest.raises(openai.BadRequestError) as e:
        _chat(tiny_tools_server, tools=tools, tool_choice="required")
    message = e.value.body["message"]
    assert "'lookup'" in message and "format 'idn-hostname' at /properties/host" in message, message
