"""Every guided-decoding kind over the OpenAI API: a JSON Schema, a regex, a choice and a Lark
grammar (Lark EBNF); a constraint the server rejects prints its 400 message.

    make serve                       # in another shell
    python examples/guided_kinds.py
"""
import json
import os

import openai

BASE_URL = os.environ.get("GDSERVE_BASE_URL", "http://127.0.0.1:8000/v1")

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                           "country_code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
          "required": ["city", "country_code"], "additionalProperties": False}
GRAMMAR = r"""
start: expr
expr: NUMBER (("+" | "-") NUMBER)*
NUMBER: /[0-9]+/
"""
KINDS = [
    ("json", "Name a big European city as JSON.", {"guided_json": SCHEMA}),
    ("regex", "Give me a phone number.", {"guided_regex": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"}),
    ("choice", "Is the sky green?", {"guided_choice": ["yes", "no"]}),
    ("grammar", "Write a sum of three numbers.", {"guided_grammar": GRAMMAR}),
]


def main() -> None:
    client = openai.OpenAI(base_url=BASE_URL, api_key="EMPTY", max_retries=0)
    model = client.models.list().data[0].id
    for kind, question, constraint in KINDS:
        try:
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                               max_tokens=64, temperature=0, extra_body=constraint)
        except openai.APIStatusError as e:  # a constraint the server rejects: its message
            error = e.body if isinstance(e.body, dict) and "message" in e.body else {"message": str(e)}
            print(f"{kind:>8}: HTTP {e.status_code}: {error['message']} (param: {error.get('param')})")
            continue
        text = r.choices[0].message.content
        if kind == "json":
            text = json.dumps(json.loads(text))  # parses: the schema held
        print(f"{kind:>8}: {text}")


if __name__ == "__main__":
    main()
