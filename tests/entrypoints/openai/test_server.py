"""The server on the tiny random-weight model, through the openai SDK: endpoints, shapes,
streaming, guided kinds, embeddings. (Its text is random bytes: tests check shapes and invariants.)"""
import asyncio
import json
import math
import re

import jsonschema
import pytest
from tokenizers import pre_tokenizers

MSG = [{"role": "user", "content": "Say something."}]


def test_health_and_models(tiny_server):
    assert tiny_server.get("/health") == ""
    models = tiny_server.client().models.list()
    assert [m.id for m in models.data] == ["test-model"]


def test_chat_completion_shape(tiny_server):
    r = tiny_server.client().chat.completions.create(model="test-model", messages=MSG, max_tokens=8,
                                                     temperature=0, n=2)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == "test-model"
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.message.role == "assistant" and isinstance(c.message.content, str)
        assert c.finish_reason in ("stop", "length")
    assert r.choices[0].message.content == r.choices[1].message.content  # greedy
    assert r.usage.completion_tokens <= 16 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_roles_and_max_completion_tokens(tiny_tools_server):
    """(The template that takes tool_calls: written out as text, the call would not fit in 128 tokens.)"""
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "system", "content": [{"type": "text", "text": "Really."}]},
                {"role": "user", "content": "Call a tool."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    r = tiny_tools_server.client().chat.completions.create(model="test-model", messages=messages, max_tokens=50,
                                                     max_completion_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_sampling_extras_are_honoured(tiny_server):
    client = tiny_server.client()
    r = client.chat.completions.create(model="test-model", messages=MSG, max_tokens=6, seed=1,
                                       extra_body={"min_tokens": 6, "top_k": 5, "min_p": 0.01,
                                                   "repetition_penalty": 1.2, "ignore_eos": True})
    assert r.usage.completion_tokens == 6
    a_id = 3 + sorted(pre_tokenizers.ByteLevel.alphabet()).index("A")  # the byte tokenizer's "A"
    forced = client.completions.create(model="test-model", prompt="x", max_tokens=4, temperature=1.0, seed=0,
                                       logit_bias={str(a_id): 100})
    assert forced.choices[0].text == "AAAA"
    stopped = client.completions.create(model="test-model", prompt="x", max_tokens=4, temperature=1.0, seed=0,
                                        logit_bias={str(a_id): 100}, stop=["AA"])
    assert stopped.choices[0].text == "" and stopped.choices[0].finish_reason == "stop"
    by_id = client.completions.create(model="test-model", prompt="x", max_tokens=4, temperature=1.0, seed=0,
                                      logit_bias={str(a_id): 100}, extra_body={"stop_token_ids": [a_id]})
    assert by_id.usage.completion_tokens == 1 and by_id.choices[0].finish_reason == "stop"


def test_completion_prompt_forms(tiny_server):
    client = tiny_server.client()
    for prompt, num in (("hello", 1), (["a", "bb", "ccc"], 3), ([72, 105], 1), ([[72], [105, 106]], 2)):
        r = client.completions.create(model="test-model", prompt=prompt, max_tokens=3, temperature=0, n=2,
                                      extra_body={"ignore_eos": True})
        assert r.id.startswith("cmpl-") and r.object == "text_completion"
        assert sorted(c.index for c in r.choices) == list(range(2 * num))
        assert r.usage.completion_tokens == 3 * 2 * num


def test_completion_echo_and_logprobs(tiny_server):
    client = tiny_server.client()
    r = client.completions.create(model="test-model", prompt="hi there", max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text.startswith("hi there")
    r = client.completions.create(model="test-model", prompt="hi", max_tokens=4, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert all(len(top) <= 3 and all(v <= 0 for v in top.values()) for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # greedy: the sampled token is the most likely one
    assert all(math.isclose(t, max(top.values())) for t, top in zip(lp.token_logprobs, lp.top_logprobs))


def test_chat_logprobs(tiny_server):
    r = tiny_server.client().chat.completions.create(model="test-model", messages=MSG, max_tokens=5,
                                                     temperature=0, logprobs=True, top_logprobs=2,
                                                     extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 2 and isinstance(item.bytes, list)
        assert math.isclose(item.logprob, item.top_logprobs[0].logprob)


def _join_chat_stream(stream) -> tuple[dict[int, str], dict[int, str], object]:
    texts, reasons, usage = {}, {}, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason is not None:
                reasons[c.index] = c.finish_reason
    return texts, reasons, usage


def test_chat_stream_joins_to_non_streamed_text(tiny_server):
    client = tiny_server.client()
    kw = dict(model="test-model", messages=MSG, max_tokens=40, temperature=0.9, seed=7, n=2)
    full = client.chat.completions.create(**kw)
    stream = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    texts, reasons, usage = _join_chat_stream(stream)
    assert texts == {c.index: c.message.content for c in full.choices}
    assert reasons == {c.index: c.finish_reason for c in full.choices}
    assert usage.completion_tokens == full.usage.completion_tokens


def test_completion_stream_joins_to_non_streamed_text(tiny_server):
    client = tiny_server.client()
    kw = dict(model="test-model", prompt=["one", "two"], max_tokens=30, temperature=1.0, seed=3)
    full = client.completions.create(**kw)
    texts = {}
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in full.choices}


def test_async_clients_concurrently(tiny_server):
    async def run():
        client = tiny_server.async_client()
        calls = [client.chat.completions.create(model="test-model", messages=MSG, max_tokens=10, seed=i,
                                                extra_body={"ignore_eos": True}) for i in range(12)]
        return await asyncio.gather(*calls)

    results = asyncio.run(run())
    assert all(r.usage.completion_tokens == 10 for r in results)


def test_guided_kinds_through_extra_body(tiny_server):
    client = tiny_server.client()

    def chat(**extra) -> str:
        r = client.chat.completions.create(model="test-model", messages=MSG, max_tokens=60, seed=0,
                                           extra_body=extra)
        assert r.choices[0].finish_reason == "stop"
        return r.choices[0].message.content

    assert re.fullmatch(r"[0-9]{3}-[a-c]{2}", chat(guided_regex=r"[0-9]{3}-[a-c]{2}"))
    assert chat(guided_choice=["red", "green", "blue"]) in {"red", "green", "blue"}
    assert chat(structured_outputs={"choice": ["yes", "no"]}) in {"yes", "no"}
    assert re.fullmatch("(ab)+", chat(structured_outputs={"regex": "(ab){1,3}"}))
    schema = {"type": "object", "properties": {"d": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "c": {"enum": ["x", "y"]}},
              "required": ["d", "c"], "additionalProperties": False}
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)},
                  {"structured_outputs": {"json": schema}},
                  {"guided_json": schema, "guided_whitespace_pattern": ""}):
        value = json.loads(chat(**extra))
        assert value["d"] in range(10) and value["c"] in ("x", "y")
    for extra in ({"guided_json": schema, "guided_whitespace_pattern": ""},
                  {"structured_outputs": {"json": schema, "disable_any_whitespace": True, "disable_fallback": True}}):
        compact = chat(**extra)
        assert " " not in compact and "\n" not in compact
    assert isinstance(json.loads(chat(structured_outputs={"json_object": True})), dict)
    # disable_additional_properties: false (vLLM's field): undeclared keys admitted, as JSON Schema
    # does; the default closes the object, and its report says so
    open_schema = {"type": "object", "properties": {"d": {"type": "integer"}}, "required": ["d"]}
    for disable, closed in ((False, False), (None, True), (True, True)):
        so = {"json": open_schema, "disable_additional_properties": disable, "report": True}
        r = client.chat.completions.create(model="test-model", messages=MSG, max_tokens=60, seed=0,
                                           extra_body={"structured_outputs": so})
        jsonschema.validate(json.loads(r.choices[0].message.content), open_schema)
        report = r.model_extra["structured_output_report"]
        assert any("only the declared properties" in a for a in report["approximated"]) == closed


def test_structured_output_report_on_request(tiny_server):
    client = tiny_server.client()
    schema = {"type": "object", "properties": {"d": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 500},
                                               "meta": {}},
              "required": ["d"], "additionalProperties": False}
    extra = {"structured_outputs": {"json": schema, "report": True}}
    r = client.chat.completions.create(model="test-model", messages=MSG, max_tokens=40, seed=0, extra_body=extra)
    report = r.model_extra["structured_output_report"]
    assert {"minimum at /properties/d", "maximum at /properties/d", "required at /",
            "additionalProperties at /"} <= set(report["exact"])
    assert "maxItems at /properties/tags" not in report["exact"]
    assert any("maxItems 500 lowered" in a for a in report["approximated"])
    assert any(a.startswith("any value at /properties/meta") for a in report["approximated"])
    assert report["ignored"] == []  # strict mode refuses what it cannot enforce
    c = client.completions.create(model="test-model", prompt="x", max_tokens=40, extra_body=extra)
    assert c.model_extra["structured_output_report"] == report
    chunks = list(client.chat.completions.create(model="test-model", messages=MSG, max_tokens=40, stream=True,
                                                 extra_body=extra))
    assert chunks[0].model_extra["structured_output_report"] == report
    assert all("structured_output_report" not in (c.model_extra or {}) for c in chunks[1:])  # once
    plain = client.chat.completions.create(model="test-model", messages=MSG, max_tokens=40,
                                           extra_body={"structured_outputs": {"json": schema}})
    assert "structured_output_report" not in (plain.model_extra or {})


def test_response_format_json_schema(tiny_server):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = tiny_server.client().chat.completions.create(
        model="test-model", messages=MSG, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_embeddings(tiny_server):
    client = tiny_server.client()
    r = client.embeddings.create(model="test-model", input=["hello", "world", "hello"])  # SDK asks base64
    vecs = [d.embedding for d in r.data]
    assert [d.index for d in r.data] == [0, 1, 2] and len(vecs[0]) == 64
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-4) for v in vecs)
    assert vecs[0] == pytest.approx(vecs[2], abs=1e-6) and vecs[0] != pytest.approx(vecs[1], abs=1e-3)
    assert r.usage.prompt_tokens == r.usage.total_tokens == 15
    floats = client.embeddings.create(model="test-model", input=[104, 105], encoding_format="float")
    assert len(floats.data) == 1 and len(floats.data[0].embedding) == 64
    status, body = tiny_server.post("/v1/embeddings", {"input": "x", "dimensions": 8})
    assert status == 400 and body["error"]["param"] == "dimensions"


def test_metrics(tiny_server):
    text = tiny_server.get("/metrics")
    for name in ("gdserve_num_requests_running", "gdserve_num_requests_waiting", "gdserve_kv_cache_usage_perc",
                 "gdserve_prefix_cache_hit_rate", "gdserve_prompt_tokens_total", "gdserve_generation_tokens_total",
                 "gdserve_time_to_first_token_seconds_bucket", "gdserve_inter_token_latency_seconds_bucket",
                 "gdserve_e2e_request_latency_seconds_bucket", "gdserve_grammar_compile_seconds_bucket",
                 "gdserve_grammar_compile_cache_hits_total"):
        assert name in text, name
    assert tiny_server.metric("gdserve_generation_tokens_total") > 0
    assert tiny_server.metric("gdserve_kv_cache_used_blocks") == 0  # nothing in flight


def test_unknown_fields_are_ignored(tiny_server):
    status, body = tiny_server.post("/v1/chat/completions", {"model": "test-model", "messages": MSG,
                                                             "max_tokens": 2, "frobnicate": {"x": 1}})
    assert status == 200 and body["object"] == "chat.completion"
