"""What the OpenAPI document (/openapi.json) says each route answers: the bodies of non-streaming
answers and the error statuses. Documentation only, the handlers build plain dicts; the schemathesis
test (tests/entrypoints/openai/test_openapi.py) checks that every answer fits it."""
from typing import Any, Literal

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    forced_tokens: int  # taken from the constraint's forced text without a decode step each


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None
    tool_calls: list[ToolCall]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class Generation(BaseModel):
    id: str
    created: int
    model: str
    usage: Usage
    structured_output_report: Any = None  # with structured_outputs.report
    structured_output_relaxed: dict[str, list[str]] | None = None  # with a schema's "strict": false


class ChatCompletion(Generation):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class Completion(Generation):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str | None      # the model's path or alias; an adapter's directory
    parent: str | None    # an adapter's base model
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


_ERRORS = {
    400: "a bad value: out of range, past a server limit, a prompt longer than the context, a constraint "
         "that does not compile, a LoRA adapter that cannot be loaded",
    401: "no or a wrong API key (with --api-key)",
    404: "an unknown model (or LoRA adapter)",
    413: "a body larger than --max-request-bytes",
    422: "a malformed body: not JSON, not UTF-8, a wrong type, a missing field",
    429: "the server is at --max-queue, or the KV cache is full",
    500: "an internal error; the body gives an id that finds it in the server log",
    503: "the engine is shutting down, or the grammar compiler is unavailable: retry",
}
_EVERY_ROUTE = (401, 413, 500)
MODEL_ROUTE = (400, 404, 422, 429, 503)  # and those of a route that runs the model on a request body
# One server-sent event (OpenAPI 3.1: a text/event-stream schema describes each event): its data is a
# chunk as JSON (an error in the stream too), and the last event's is [DONE].
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"anyOf": [{"const": "[DONE]"}, {"type": "string", "pattern": "^\\{"}]}}}


def responses(*statuses: int, ok: type[BaseModel] | None = None, streams: bool = False) -> dict:
    """FastAPI's `responses=`: the 200 body (and an event stream when the request asks for one),
    and the errors every route can answer (401, 413, 500) plus `statuses`."""
    out: dict[int | str, dict] = {}
    if ok is not None:
        out[200] = {"model": ok}
        if streams:
            out[200]["content"] = {"text/event-stream": {"schema": _SSE_EVENT}}
            out[200]["description"] = "a JSON body, or with `stream: true` server-sent events"
    for status in sorted({*statuses, *_EVERY_ROUTE}):
        out[status] = {"model": ErrorResponse, "description": _ERRORS[status]}
    return out
