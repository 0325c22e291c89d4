"""The OpenAPI document is accurate and no request gets a 5xx: schemathesis generates requests from
/openapi.json, valid ones and (per the document) invalid ones, against the tiny server, and checks
each answer's status code, content type and body against the document.

Each operation is fuzzed through schemathesis' strategies under a plain Hypothesis @given: the server's
URL is known only once its fixture runs, and schemathesis' lazy fixture schemas (`from_fixture` with
`parametrize()`) fail under pytest 9 (schemathesis 4.32 reads `request.node._nodeid`)."""
import pytest

schemathesis = pytest.importorskip("schemathesis")  # Python >= 3.11
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

OPERATIONS = ["GET /health", "GET /metrics", "GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions",
              "POST /v1/embeddings"]
BODY_OPERATIONS = [op for op in OPERATIONS if op.startswith("POST")]  # a GET has no input to make invalid
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
MAX_EXAMPLES = 40   # per operation and generation mode
CONTEXT = 128       # the tiny model's max_model_len
CHEAP_TOKENS = 4    # what a generated request may generate at most


@pytest.fixture(scope="module")
def api_schema(tiny_server):
    return schemathesis.openapi.from_url(f"{tiny_server.url}/openapi.json")


def test_every_route_is_documented(api_schema):
    documented = [result.ok().label for result in api_schema.get_all_operations()]
    assert sorted(documented) == sorted(OPERATIONS)


@pytest.mark.parametrize("mode,operation", [("positive", op) for op in OPERATIONS] +
                                           [("negative", op) for op in BODY_OPERATIONS])
def test_answers_match_the_document(api_schema, mode, operation):
    method, path = operation.split()
    strategy = api_schema[path][method].as_strategy(generation_mode=schemathesis.GenerationMode(mode))

    @given(case=strategy)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def answer_matches(case):
        if isinstance(case.body, dict):
            cap_generation(case.body)
        case.call_and_validate(checks=CHECKS)

    answer_matches()


def cap_generation(body: dict) -> None:
    """Keep a generated request cheap on two slow cores: a few tokens at most. Values the server must
    refuse (< 1, past the context, not integers) are kept: they are answered at once."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if (value is None and key == "max_tokens") or (isinstance(value, int) and CHEAP_TOKENS < value < CONTEXT):
            body[key] = CHEAP_TOKENS
