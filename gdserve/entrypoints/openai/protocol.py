"""Pydantic models of the OpenAI API requests we accept. Unknown fields are accepted and ignored
(extra="allow"); every field declared here is honoured or rejected with a 400 by the handlers.
Value ranges are checked by SamplingParams and limits.RequestLimits (400), types by pydantic (422;
NaN and infinities, which JSON does not have, are type errors)."""
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class JsonSchemaFormat(OpenAIModel):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None  # false: best effort (compiled leniently, what was relaxed reported)


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(OpenAIModel):
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    # False admits undeclared keys wherever JSON Schema does; unset or True closes objects that
    # declare properties (the default)
    disable_additional_properties: bool | None = None
    disable_fallback: bool = False  # accepted: one backend, which never falls back
    report: bool = False  # add the constraint's enforcement report to the response


class SamplingRequest(OpenAIModel):
    """Fields shared by chat and completions (OpenAI's, then vLLM's extras)."""
    model: str | None = None
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    structured_outputs: StructuredOutputs | None = None


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's completions default
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class EmbeddingRequest(OpenAIModel):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class LoadLoRAAdapterRequest(OpenAIModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(OpenAIModel):
    lora_name: str | None = None
    lora_int_id: int | None = None
