"""A request's output constraint (guided_* fields, structured_outputs, response_format) as
StructuredOutputsParams. More than one constraint is a 400; so is a constraint that fails to compile.

OpenAI's `strict`: a JSON Schema with `"strict": false` (response_format.json_schema, a function
tool) is compiled leniently, keywords it cannot enforce relaxed instead of refused; the response then
says what was relaxed (structured_output_relaxed). `true` or absent: exact, or a 400."""
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gdserve.entrypoints.openai.errors import bad_request
from gdserve.entrypoints.openai.protocol import SamplingRequest
from gdserve.grammar import Grammar
from gdserve.sampling_params import StructuredOutputsParams


def guided_params(request: SamplingRequest) -> tuple[StructuredOutputsParams | None, str | None]:
    """(the constraint, the request field it came from) or (None, None)."""
    found = _constraints(request)
    if len(found) > 1:
        raise bad_request(f"a request takes at most one output constraint; got {', '.join(found)}",
                          param=next(iter(found)))
    whitespace = request.guided_whitespace_pattern
    if whitespace is not None and not any(kind in ("json", "json_object") for kind, _ in found.values()):
        raise bad_request("guided_whitespace_pattern needs a JSON constraint (guided_json, "
                          "structured_outputs.json or response_format)", "guided_whitespace_pattern")
    if not found:
        return None, None
    (param, (kind, spec)), = found.items()
    so = request.structured_outputs
    if so is not None and so.whitespace_pattern:
        whitespace = so.whitespace_pattern
    options = {} if so is None else {"disable_any_whitespace": so.disable_any_whitespace,
                                     "disable_additional_properties": so.disable_additional_properties}
    if kind == "json" and isinstance(spec, str):
        spec = _parse_schema(spec, param)
    lenient = param == "response_format" and kind == "json" and request.response_format.json_schema.strict is False
    try:
        return StructuredOutputsParams(**{kind: spec}, whitespace_pattern=whitespace, lenient=lenient,
                                       **options), param
    except ValueError as e:
        raise bad_request(str(e), param) from None


def constraint_fields(request: SamplingRequest) -> list[str]:
    """The request fields that constrain the output (response_format text is none)."""
    return list(_constraints(request))


def _constraints(request: SamplingRequest) -> dict[str, tuple[str, object]]:
    found = {}
    for kind in ("json", "regex", "choice", "grammar"):
        value = getattr(request, f"guided_{kind}")
        if value is not None:
            found[f"guided_{kind}"] = (kind, value)
    so = request.structured_outputs
    if so is not None:
        kinds = [(k, v) for k, v in (("json", so.json_), ("regex", so.regex), ("choice", so.choice),
                                     ("grammar", so.grammar), ("json_object", so.json_object or None))
                 if v is not None]
        if len(kinds) != 1:
            raise bad_request("structured_outputs takes exactly one of json, regex, choice, grammar, json_object; "
                              f"got {', '.join(k for k, _ in kinds) or 'none'}", "structured_outputs")
        found["structured_outputs"] = kinds[0]
    rf = request.response_format
    if rf is not None and rf.type == "json_object":
        found["response_format"] = ("json_object", True)
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise bad_request("response_format json_schema needs json_schema.schema", "response_format")
        found["response_format"] = ("json", rf.json_schema.schema_)
    return found


def _parse_schema(text: str, param: str) -> dict:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad_request(f"{param} is not valid JSON: {e}", param) from None
    except RecursionError:
        raise bad_request(f"{param} nests too deeply to parse", param) from None
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"{param} must be a JSON Schema object", param)
    return schema


RESPONSE_FORMAT_SCHEMA = "response_format.json_schema.schema"


@dataclass(frozen=True)
class Constraint:
    """A request's compiled constraint (None: unconstrained) and, for each schema compiled leniently,
    what its compile relaxed ("keyword at /pointer (note)", pointers into that schema), keyed by the
    request field that holds the schema (RESPONSE_FORMAT_SCHEMA, "tools[i].function.parameters").
    A lenient schema with nothing relaxed has an empty list: it was enforced as written."""
    grammar: Grammar | None = None
    relaxed: dict[str, list[str]] = field(default_factory=dict)


def output_fields(request: SamplingRequest, constraint: Constraint) -> dict:
    """The response's structured-output fields: {"structured_output_relaxed": ...} when a schema was
    compiled leniently; {"structured_output_report": ...} when structured_outputs.report asks for it
    (for a JSON Schema, each assertion keyword by JSON pointer as exact, approximated or ignored)."""
    fields = {}
    if constraint.relaxed:
        fields["structured_output_relaxed"] = constraint.relaxed
    so = request.structured_outputs
    if so is not None and so.report:
        fields["structured_output_report"] = getattr(constraint.grammar, "report", None)
    return fields


def output_headers(constraint: Constraint) -> dict[str, str]:
    """X-Structured-Output-Relaxed: how many keywords were relaxed, beside structured_output_relaxed
    (some clients pass on headers but not unknown body fields)."""
    if not constraint.relaxed:
        return {}
    return {"X-Structured-Output-Relaxed": str(sum(map(len, constraint.relaxed.values())))}


async def fields_in_first_chunk(chunks: AsyncIterator[dict]) -> AsyncIterator[dict]:
    """A stream carries the structured-output fields once, in its first chunk."""
    first = True
    async for chunk in chunks:
        if not first:
            chunk.pop("structured_output_report", None)
            chunk.pop("structured_output_relaxed", None)
        first = False
        yield chunk
