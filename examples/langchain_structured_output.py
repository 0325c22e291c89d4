"""LangChain's ChatOpenAI on gdserve: `with_structured_output` by each of its three methods.

    make serve                       # in another shell
    python examples/langchain_structured_output.py

json_schema sends response_format json_schema; function_calling sends the model as a tool with a
named tool_choice; json_mode sends response_format json_object (any JSON object), so the prompt
must describe the fields. GDSERVE_BASE_URL overrides http://127.0.0.1:8000/v1.
"""
import os

from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel, Field

BASE_URL = os.environ.get("GDSERVE_BASE_URL", "http://127.0.0.1:8000/v1")


class Person(BaseModel):
    """A person mentioned in the text."""
    name: str = Field(description="the person's first name", max_length=20)
    age: int = Field(description="the age in years", ge=0, le=120)


def main() -> None:
    model = OpenAI(base_url=BASE_URL, api_key="EMPTY").models.list().data[0].id
    llm = ChatOpenAI(base_url=BASE_URL, api_key="EMPTY", model=model, temperature=0, max_tokens=64)
    text = "Alice is 30 years old and lives in Paris. Extract the person."
    hint = ' Reply with a JSON object with the keys "name" (a string) and "age" (an integer).'
    for method in ("json_schema", "function_calling", "json_mode"):
        prompt = text + hint if method == "json_mode" else text
        person = llm.with_structured_output(Person, method=method).invoke(prompt)
        assert isinstance(person, Person)
        print(f"{method:>16}: {person!r}")
    out = llm.with_structured_output(Person, method="function_calling", include_raw=True).invoke(
        "Bob turned 41 last week. Extract the person.")
    call = out["raw"].tool_calls[0]
    print(f"{'include_raw':>16}: parsed={out['parsed']!r}, raw tool call {call['name']}({call['args']}) id={call['id']}")


if __name__ == "__main__":
    main()
