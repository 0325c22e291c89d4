"""End to end on the default model (SmolLM2): structured outputs valid against their schemas,
under concurrency; streaming; a client that disconnects frees its blocks."""
import asyncio
import contextlib
import json
import time
from pathlib import Path

import jsonschema
import openai
import pydantic
import pytest

SCHEMAS = Path(__file__).parents[3] / "schemas"
# Schemas whose valid outputs are all short (SmolLM2 can loop inside an unbounded string or array
# until max_tokens, a known limit): four from schemas/, four written here.
FROM_CORPUS = ["enums", "bank_transaction", "draft4_style", "const_values"]
INLINE = {
    "sentiment": {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                  "score": {"type": "integer", "minimum": 0, "maximum": 100}},
                  "required": ["sentiment", "score"], "additionalProperties": False},
    "city": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
             "country_code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
             "required": ["city", "country_code"], "additionalProperties": False},
    "numbers": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999},
                "minItems": 1, "maxItems": 5},
    "todo": {"type": "object", "properties": {"done": {"type": "boolean"},
             "tags": {"type": "array", "items": {"enum": ["home", "work", "urgent"]}, "maxItems": 3}},
             "required": ["done", "tags"], "additionalProperties": False},
}


def _validate(text: str, schema: dict) -> None:
    cls = jsonschema.validators.validator_for(schema)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(json.loads(text))


def _ask(title: str) -> list[dict]:
    return [{"role": "user", "content": f"Reply with one short JSON value for: {title}."}]


def test_32_concurrent_structured_requests_are_valid(smollm2_server):
    schemas = {name: json.loads((SCHEMAS / f"{name}.json").read_text()) for name in FROM_CORPUS} | INLINE
    jobs = [(name, i) for i in range(4) for name in schemas]

    def request(client, name: str, seed: int, max_tokens: int):
        return client.chat.completions.create(
            model="smollm2", messages=_ask(schemas[name].get("title", name)), max_tokens=max_tokens,
            temperature=0.5, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": name, "schema": schemas[name], "strict": True}})

    async def run():
        client = smollm2_server.async_client(timeout=300)
        for name in schemas:  # compile first (one at a time), off the clock below; max_tokens 1 holds
            with contextlib.suppress(openai.BadRequestError):  # no complete output: a 400 once compiled
                await request(client, name, 0, 1)
        return await asyncio.gather(*(request(client, name, i, 160) for name, i in jobs))

    results = asyncio.run(run())
    for (name, _), r in zip(jobs, results):
        assert r.choices[0].finish_reason == "stop", (name, r.choices[0].message.content)
        _validate(r.choices[0].message.content, schemas[name])
    assert smollm2_server.metric("gdserve_grammar_compile_cache_hits_total") >= 32


def test_guided_kinds_on_the_real_model(smollm2_server):
    client = smollm2_server.client()

    def chat(content: str, **kw) -> str:
        r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": content}],
                                           max_tokens=40, temperature=0, **kw)
        assert r.choices[0].finish_reason == "stop"
        return r.choices[0].message.content

    assert chat("Is the sky blue? Answer yes or no.", extra_body={"guided_choice": ["yes", "no"]}) in ("yes", "no")
    phone = chat("Invent a phone number.", extra_body={"guided_regex": r"[0-9]{3}-[0-9]{4}"})
    assert len(phone) == 8 and phone[3] == "-"
    obj = json.loads(chat('Repeat exactly this JSON object: {"ok": true}', response_format={"type": "json_object"}))
    assert isinstance(obj, dict)


def test_sdk_parse_with_a_pydantic_model(smollm2_server):
    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=30)
        population: int = pydantic.Field(ge=0, le=50_000_000)

    r = smollm2_server.client().chat.completions.parse(
        model="smollm2", messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
        response_format=City, max_tokens=60, temperature=0)
    assert isinstance(r.choices[0].message.parsed, City)


def test_stream_joins_to_non_streamed_text(smollm2_server):
    client = smollm2_server.client()
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "Write a sentence about tea."}],
              max_tokens=24, temperature=0.8, seed=11)
    full = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                       if c.choices)
    assert streamed == full and full


def test_forced_text_is_reported_in_usage_and_streams_as_the_rest(smollm2_server):
    """A compact JSON object of required keys: its keys and punctuation are forced; usage says
    how many tokens were, and the stream joins to the non-streamed text."""
    client = smollm2_server.client()
    schema = INLINE["sentiment"]
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "I love it. Sentiment as JSON."}],
              max_tokens=48, temperature=0.0,
              extra_body={"structured_outputs": {"json": schema, "disable_any_whitespace": True}})
    reply = client.chat.completions.create(**kw)
    _validate(reply.choices[0].message.content, schema)
    assert reply.usage.completion_tokens_details.forced_tokens >= 3
    assert reply.usage.completion_tokens_details.forced_tokens < reply.usage.completion_tokens
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.choices[0].message.content
    assert chunks[-1].usage.completion_tokens_details.forced_tokens == reply.usage.completion_tokens_details.forced_tokens


def test_disconnect_mid_stream_frees_blocks(smollm2_server):
    s = smollm2_server
    stream = s.client().completions.create(model="smollm2", prompt="Count: 1, 2, 3,", max_tokens=1500,
                                           stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    assert s.metric("gdserve_kv_cache_used_blocks") > 0
    stream.close()
    deadline = time.monotonic() + 15
    while s.metric("gdserve_kv_cache_used_blocks") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert s.metric("gdserve_kv_cache_used_blocks") == 0
    assert s.metric("gdserve_num_requests_running") == 0


@pytest.mark.parametrize("format_", ["json_object", "json_schema"])
def test_response_format_streamed(smollm2_server, format_):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    rf = {"type": format_} if format_ == "json_object" else \
        {"type": format_, "json_schema": {"name": "a", "schema": schema}}
    text = "".join(c.choices[0].delta.content or "" for c in smollm2_server.client().chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is 2+2? Reply as JSON with key answer."}],
        max_tokens=40, temperature=0, response_format=rf, stream=True) if c.choices)
    value = json.loads(text)
    if format_ == "json_schema":
        jsonschema.validate(value, schema)
    assert isinstance(value, dict)
