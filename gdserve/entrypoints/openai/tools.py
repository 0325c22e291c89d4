"""`tools` + `tool_choice` + `parallel_tool_calls` -> a ToolPlan: the validated functions, the mode,
and for the forced modes (a named function, "required") the JSON Schema the output must follow."""
import re
from dataclasses import dataclass, field
from typing import Literal

from gdserve.entrypoints.openai.errors import bad_request
from gdserve.entrypoints.openai.protocol import ChatCompletionRequest
from gdserve.entrypoints.openai.structured import constraint_fields

Mode = Literal["none", "auto", "named", "required"]
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict
    index: int  # position in request.tools (for error messages)
    strict: bool | None = None  # OpenAI's function.strict: False compiles the parameters leniently

    @property
    def where(self) -> str:
        """The request field of the parameters (errors and structured_output_relaxed name it)."""
        return f"tools[{self.index}].function.parameters"


@dataclass
class ToolPlan:
    mode: Mode
    functions: list[Function]
    tools: list[dict]            # the request's tool dicts, for chat templates that take `tools=`
    parallel: bool = True
    named: Function | None = None
    names: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = {f.name for f in self.functions}

    @property
    def forced(self) -> bool:
        return self.mode in ("named", "required")

    def schema(self) -> dict:
        """What a forced mode's output must be: the named function's arguments, or
        {"name": ..., "arguments": ...} over all functions (a non-empty array of them if parallel)."""
        if self.mode == "named":
            return self.named.parameters
        calls = [call_schema(f) for f in self.functions]
        one = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return {"type": "array", "items": one, "minItems": 1} if self.parallel else one


def call_schema(f: Function) -> dict:
    """{"name": const, "arguments": parameters}, name first (the stream parser relies on the order).
    The parameters become a schema resource of their own ($id), so their local `#/$defs/...` refs
    still resolve inside the combined schema."""
    arguments = f.parameters if "$id" in f.parameters else {"$id": f"urn:gdserve:tool:{f.index}", **f.parameters}
    return {"type": "object", "properties": {"name": {"const": f.name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False}


def plan_tools(request: ChatCompletionRequest) -> ToolPlan | None:
    """None when the request has no tools (a tool_choice that needs them is a 400)."""
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    functions = [_function(t, i) for i, t in enumerate(request.tools)]
    _check_unique(functions)
    mode, named = _mode(choice, functions)
    if constraint_fields(request):
        mode = _with_constraint(request, mode)
    parallel = request.parallel_tool_calls is not False
    return ToolPlan(mode, functions, list(request.tools), parallel, named)


def _function(tool: dict, i: int) -> Function:
    where = f"tools[{i}]"
    if tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict):
        raise bad_request(f"{where}: only function tools are supported: "
                          '{"type": "function", "function": {"name": ..., "parameters": ...}}', "tools")
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_request(f"{where}.function.name must be 1-64 characters of a-z, A-Z, 0-9, _ . : -; "
                          f"got {name!r}", "tools")
    parameters = fn.get("parameters")
    if parameters is None:
        parameters = EMPTY_PARAMETERS
    problem = schema_problem(parameters)
    if problem:
        raise bad_request(f"{where}.function.parameters (function '{name}') is not a valid JSON Schema: "
                          f"{problem}", "tools")
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"{where}.function.strict (function '{name}') must be true or false, got {strict!r}",
                          "tools")
    description = fn.get("description")
    return Function(name, description if isinstance(description, str) else None, parameters, i, strict)


def schema_problem(schema, ptr: str = "") -> str | None:
    """A structural check every mode gets (forced modes also compile the schema): objects where
    schemas go, known type names, `required` a list of strings."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"the schema at '{ptr or '/'}' must be an object, got {type(schema).__name__}"
    types = schema.get("type")
    for t in types if isinstance(types, list) else ([types] if types is not None else []):
        if t not in _JSON_TYPES:
            return f"unknown type {t!r} at '{ptr}/type'"
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        return f"'{ptr}/required' must be a list of property names"
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        subs = schema.get(key)
        if subs is None:
            continue
        if not isinstance(subs, dict):
            return f"'{ptr}/{key}' must be an object mapping names to schemas"
        for name, sub in subs.items():
            if (problem := schema_problem(sub, f"{ptr}/{key}/{name}")) is not None:
                return problem
    for key in ("items", "additionalProperties", "not"):
        if key in schema and (problem := schema_problem(schema[key], f"{ptr}/{key}")) is not None:
            return problem
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        subs = schema.get(key)
        if subs is not None and not isinstance(subs, list):
            return f"'{ptr}/{key}' must be a list of schemas"
        for j, sub in enumerate(subs or []):
            if (problem := schema_problem(sub, f"{ptr}/{key}/{j}")) is not None:
                return problem
    return None


def _check_unique(functions: list[Function]) -> None:
    seen = set()
    for f in functions:
        if f.name in seen:
            raise bad_request(f"tools: function name '{f.name}' appears more than once", "tools")
        seen.add(f.name)


def _mode(choice, functions: list[Function]) -> tuple[Mode, Function | None]:
    if choice is None or choice in ("auto", "none", "required"):
        return choice or "auto", None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name", choice.get("name"))
        if choice.get("type", "function") == "function" and isinstance(name, str):
            for f in functions:
                if f.name == name:
                    return "named", f
            raise bad_request(f"tool_choice names the function '{name}', which is not in tools "
                              f"(tools: {', '.join(f.name for f in functions)})", "tool_choice")
    raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", '
                      f'"function": {{"name": ...}}}}; got {choice!r}', "tool_choice")


def _with_constraint(request: ChatCompletionRequest, mode: Mode) -> Mode:
    """A tool_choice other than "none" and response_format / guided_* can't both shape the output.
    Tools without a tool_choice beside a constraint: the constraint applies and the tools stay in
    the prompt, as with "none"."""
    if request.tool_choice is None or mode == "none":
        return "none"
    raise bad_request(f"tool_choice {request.tool_choice!r} cannot be combined with "
                      f"{', '.join(constraint_fields(request))}: both constrain the output (use "
                      'tool_choice "none" to keep the tools in the prompt only)', "tool_choice")
