"""LangChain's ChatOpenAI against the server on the default model: with_structured_output by each
method (json_schema: response_format; function_calling: tools + a named tool_choice; json_mode:
json_object plus a prompt that describes the fields), plain and with include_raw, sync and async."""
import asyncio

import pytest
from pydantic import BaseModel, Field

langchain_openai = pytest.importorskip("langchain_openai", reason="pip install -e '.[dev]' (langchain-openai)")


class Person(BaseModel):
    """A person mentioned in the text."""
    name: str = Field(description="the person's first name", max_length=20)
    age: int = Field(description="the age in years", ge=0, le=120)


class Sentiment(BaseModel):
    label: str = Field(json_schema_extra={"enum": ["positive", "negative", "neutral"]})
    confident: bool


TEXT = "Alice is 30 years old and lives in Paris. Extract the person."
JSON_HINT = ' Reply with a JSON object with the keys "name" (a string) and "age" (an integer).'


def _llm(server, **kw):
    return langchain_openai.ChatOpenAI(base_url=f"{server.url}/v1", api_key="EMPTY", model=server.model,
                                       temperature=0, max_tokens=64, max_retries=0, **kw)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_with_structured_output(smollm2_server, method):
    prompt = TEXT + (JSON_HINT if method == "json_mode" else "")
    person = _llm(smollm2_server).with_structured_output(Person, method=method).invoke(prompt)
    assert isinstance(person, Person)
    assert person.name == "Alice" and person.age == 30


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_include_raw(smollm2_server, method):
    out = _llm(smollm2_server).with_structured_output(Sentiment, method=method, include_raw=True).invoke(
        "I love this phone, it is great. Classify the sentiment.")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Sentiment)
    assert out["parsed"].label in ("positive", "negative", "neutral")
    raw = out["raw"]
    if method == "function_calling":
        assert raw.response_metadata["finish_reason"] == "tool_calls"
        assert [c["name"] for c in raw.tool_calls] == ["Sentiment"] and raw.tool_calls[0]["id"].startswith("call_")
        assert raw.tool_calls[0]["args"] == out["parsed"].model_dump()
    else:
        assert Sentiment.model_validate_json(raw.content) == out["parsed"]


def test_streamed_and_async_function_calling(smollm2_server):
    structured = _llm(smollm2_server).with_structured_output(Person, method="function_calling")
    chunks = list(structured.stream(TEXT))
    assert chunks and chunks[-1] == Person(name="Alice", age=30)

    async def several():
        prompts = [f"{name} is {age} years old. Extract the person." for name, age in [("Bob", 41), ("Carol", 7)]]
        return await structured.abatch(prompts)

    assert asyncio.run(several()) == [Person(name="Bob", age=41), Person(name="Carol", age=7)]


def test_bind_tools_auto_call_from_history(smollm2_server):
    """tool_choice auto: the model sees two earlier calls in the history and calls the tool itself."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    history = []
    for i, city in enumerate(["Paris", "Rome"]):
        history += [HumanMessage(f"Weather in {city}?"),
                    AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": city}, "id": f"call_{i}"}]),
                    ToolMessage("18C", tool_call_id=f"call_{i}")]
    reply = _llm(smollm2_server).bind_tools([get_weather]).invoke(history + [HumanMessage("Weather in Oslo?")])
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("get_weather", {"city": "Oslo"})]
