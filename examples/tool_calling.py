"""Tool calling over the OpenAI API: a named tool call (the arguments are constrained to the
function's JSON Schema), a `required` call (the model picks the function), then the tool's result
goes back as a `tool` message and the model answers in text.

    make serve                       # in another shell
    python examples/tool_calling.py
"""
import json
import os

from openai import OpenAI

BASE_URL = os.environ.get("GDSERVE_BASE_URL", "http://127.0.0.1:8000/v1")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount of money between currencies.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
            "from_currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "to_currency": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["amount", "from_currency", "to_currency"], "additionalProperties": False}}},
]


def get_weather(city: str, unit: str) -> dict:
    return {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit, "sky": "sunny"}


def convert_currency(amount: float, from_currency: str, to_currency: str) -> dict:
    return {"amount": round(amount * 1.1, 2), "currency": to_currency}


FUNCTIONS = {"get_weather": get_weather, "convert_currency": convert_currency}


def show(label: str, message) -> None:
    for call in message.tool_calls or []:
        print(f"{label}: {call.function.name}({call.function.arguments})  id={call.id}")


def main() -> None:
    client = OpenAI(base_url=BASE_URL, api_key="EMPTY")
    model = client.models.list().data[0].id
    ask = lambda messages, **kw: client.chat.completions.create(  # noqa: E731
        model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=96, **kw).choices[0]

    messages = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    named = ask(messages, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.finish_reason == "tool_calls"
    show("named   ", named.message)

    required = ask([{"role": "user", "content": "How much is 100 US dollars in euros?"}], tool_choice="required",
                   parallel_tool_calls=False)
    assert required.finish_reason == "tool_calls" and len(required.message.tool_calls) == 1
    show("required", required.message)

    # run the named call and send its result back; the model answers in text
    call = named.message.tool_calls[0]
    result = FUNCTIONS[call.function.name](**json.loads(call.function.arguments))
    messages += [named.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]
    final = ask(messages, tool_choice="none")
    print(f"answer  : {final.message.content}")


if __name__ == "__main__":
    main()
