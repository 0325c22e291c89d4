"""POST /v1/chat/completions: messages (+ tools) -> chat template -> one engine request with n
samples; with tools, each choice's text goes through its ChoiceTools (tool_stream.py)."""
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from gdserve.entrypoints.openai.chat_render import render_chat
from gdserve.entrypoints.openai.deltas import DeltaTracker
from gdserve.entrypoints.openai.errors import bad_request
from gdserve.entrypoints.openai.logprobs import chat_logprobs
from gdserve.entrypoints.openai.protocol import ChatCompletionRequest
from gdserve.entrypoints.openai.serving import (ServingContext, abort_on_disconnect, collect, compile_constraint,
                                                merge, new_id, now, sampling_params, start_all, usage)
from gdserve.entrypoints.openai.sse import sse_response
from gdserve.entrypoints.openai.structured import fields_in_first_chunk, output_fields, output_headers
from gdserve.entrypoints.openai.tool_stream import choice_tools
from gdserve.entrypoints.openai.tool_constraint import compile_tools
from gdserve.entrypoints.openai.tools import ToolPlan, plan_tools
from gdserve.outputs import RequestOutput


async def create_chat_completion(ctx: ServingContext, request: ChatCompletionRequest, raw: Request):
    lora_request = ctx.resolve_model(request.model)
    ctx.limits.check_sampling(request)
    _reject_unsupported(request)
    plan = plan_tools(request)
    text = render_chat(ctx.tokenizer, ctx.chat_template, request.messages, plan, request.add_generation_prompt,
                       request.chat_template_kwargs)
    prompt = (text, ctx.tokenizer.encode(text, add_special_tokens=False))
    ctx.check_queue(1)
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    params = sampling_params(request, max_tokens, _num_logprobs(request))
    if plan is not None and plan.forced:
        constraint = await compile_tools(ctx, plan)
    else:
        constraint = await compile_constraint(ctx, request)
    request_id = new_id("chatcmpl")
    streams = await start_all(ctx, request_id, [prompt], params, constraint.grammar, lora_request)
    meta = dict(id=request_id, created=now(), model=ctx.models.model_name(lora_request), **output_fields(request, constraint))
    headers = output_headers(constraint)
    if request.stream:
        return sse_response(fields_in_first_chunk(_stream(ctx, request, plan, streams, meta)), headers)
    (out,) = await abort_on_disconnect(raw, collect(streams))
    return JSONResponse(_response(ctx, request, plan, out, meta), headers=headers)


def _reject_unsupported(request: ChatCompletionRequest) -> None:
    if request.top_logprobs is not None and not request.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    if not request.messages:
        raise bad_request("messages must not be empty", "messages")


def _num_logprobs(request: ChatCompletionRequest) -> int | None:
    return (request.top_logprobs or 0) if request.logprobs else None


def _logprobs(ctx: ServingContext, request: ChatCompletionRequest, token_ids, logprobs) -> dict | None:
    if not request.logprobs or logprobs is None:
        return None
    return {"content": chat_logprobs(ctx.token_text, token_ids, logprobs, request.top_logprobs or 0),
            "refusal": None}


def _response(ctx: ServingContext, request: ChatCompletionRequest, plan: ToolPlan | None, out: RequestOutput,
              meta: dict) -> dict:
    choices = []
    for c in out.outputs:
        message = {"role": "assistant", "content": c.text, "refusal": None, "tool_calls": []}
        finish_reason = c.finish_reason
        if (tools := choice_tools(plan)) is not None:
            tools.feed(c.text)
            tools.finish()
            message, finish_reason = tools.message(), tools.finish_reason(c.finish_reason)
        choices.append({"index": c.index, "message": message,
                        "logprobs": _logprobs(ctx, request, c.token_ids, c.logprobs), "finish_reason": finish_reason})
    return {**meta, "object": "chat.completion", "choices": choices, "usage": usage([out])}


async def _stream(ctx: ServingContext, request: ChatCompletionRequest, plan: ToolPlan | None, streams,
                  meta: dict) -> AsyncIterator[dict]:
    include_usage = request.stream_options is not None and request.stream_options.include_usage
    extra = {"usage": None} if include_usage else {}
    tracker, last, tools = DeltaTracker(), None, {}

    def chunk(index: int, delta: dict, logprobs=None, finish_reason=None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {**meta, "object": "chat.completion.chunk", "choices": [choice], **extra}

    async for _, out in merge(streams):
        last = out
        for c in out.outputs:
            d = tracker.delta(c.index, c)
            if d is None:
                continue
            if d.first:
                tools[c.index] = choice_tools(plan)
                yield chunk(c.index, {"role": "assistant", "content": ""})
            handler = tools[c.index]
            logprobs = _logprobs(ctx, request, d.token_ids, d.logprobs) if d.token_ids else None
            if handler is None:
                deltas = [{"content": d.text}] if d.text or logprobs else []
            else:
                deltas = handler.feed(d.text) + (handler.finish() if d.finish_reason is not None else [])
                if logprobs and not deltas:
                    deltas = [{}]
            for k, delta in enumerate(deltas):
                yield chunk(c.index, delta, logprobs if k == 0 else None)
            if d.finish_reason is not None:
                reason = d.finish_reason if handler is None else handler.finish_reason(d.finish_reason)
                yield chunk(c.index, {}, finish_reason=reason)
    if include_usage:
        yield {**meta, "object": "chat.completion.chunk", "choices": [], "usage": usage([last])}
