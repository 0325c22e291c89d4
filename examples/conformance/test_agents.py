"""A schema-conformance suite for an agent's structured outputs, on the gdserve pytest plugin
(installed with gdserve; `pip install openai jsonschema` for the server fixture and the checks).

    pytest examples/conformance                                  # the default model
    pytest examples/conformance --gdserve-model PATH --gdserve-arg="--max-model-len 2048"

Every schema in schemas/ runs against the OpenAI server; the pydantic model runs offline.
"""
import pytest
from pydantic import BaseModel, Field

from gdserve import SamplingParams
from gdserve.testing import assert_conforms


class Ticket(BaseModel):
    title: str = Field(min_length=1, max_length=12)
    priority: int = Field(ge=1, le=4)


@pytest.mark.schema("schemas")
def test_server_output_conforms(gdserve_server, schema):
    response = gdserve_server.client.chat.completions.create(
        model=gdserve_server.model,
        messages=[{"role": "user", "content": f"Reply with a {schema['title']} as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": schema["title"], "schema": schema}},
        max_tokens=80, temperature=0)
    assert_conforms(response.choices[0].message.content, schema)


# with_args: pytest reads a lone class passed to a marker as the thing being marked
@pytest.mark.schema.with_args(Ticket)
def test_offline_output_conforms(gdserve_llm, schema):
    params = SamplingParams(max_tokens=60, temperature=0, structured_outputs={"json": schema})
    output = gdserve_llm.generate("A support ticket as JSON:", params)[0]
    assert_conforms(output.outputs[0].text, schema)
