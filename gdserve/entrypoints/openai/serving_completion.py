"""POST /v1/completions: one engine request per prompt; choice index = prompt * n + sample."""
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from gdserve.entrypoints.openai.deltas import DeltaTracker
from gdserve.entrypoints.openai.errors import bad_request
from gdserve.entrypoints.openai.logprobs import completion_logprobs
from gdserve.entrypoints.openai.protocol import CompletionRequest
from gdserve.entrypoints.openai.serving import (ServingContext, abort_on_disconnect, collect, compile_constraint, encode_prompts,
                                                merge, new_id, now, sampling_params, start_all, usage)
from gdserve.entrypoints.openai.sse import sse_response
from gdserve.entrypoints.openai.structured import fields_in_first_chunk, output_fields, output_headers
from gdserve.outputs import RequestOutput


async def create_completion(ctx: ServingContext, request: CompletionRequest, raw: Request):
    lora_request = ctx.resolve_model(request.model)
    ctx.limits.check_sampling(request)
    _reject_unsupported(ctx, request)
    prompts = encode_prompts(ctx, request.prompt, "prompt")
    ctx.check_queue(len(prompts))
    params = sampling_params(request, request.max_tokens, request.logprobs, request.best_of)
    constraint = await compile_constraint(ctx, request)
    request_id = new_id("cmpl")
    streams = await start_all(ctx, request_id, prompts, params, constraint.grammar, lora_request)
    meta = dict(id=request_id, created=now(), model=ctx.models.model_name(lora_request), **output_fields(request, constraint))
    headers = output_headers(constraint)
    if request.stream:
        return sse_response(fields_in_first_chunk(_stream(ctx, request, prompts, streams, meta)), headers)
    outputs = await abort_on_disconnect(raw, collect(streams))
    return JSONResponse(_response(ctx, request, prompts, outputs, meta), headers=headers)


def _reject_unsupported(ctx: ServingContext, request: CompletionRequest) -> None:
    if request.suffix is not None:
        raise bad_request("suffix is not supported", "suffix")
    if request.best_of is not None and request.best_of > request.n:
        if request.stream:  # the candidates are ranked only once all have finished
            raise bad_request("best_of > n is not supported with stream", "best_of")
        if request.best_of > ctx.limits.max_n:
            raise bad_request(f"best_of must be <= {ctx.limits.max_n} (this server's --max-n), got "
                              f"{request.best_of}", "best_of")
    if request.echo and request.logprobs is not None:
        raise bad_request("echo with logprobs is not supported (prompt logprobs are not computed)", "echo")


def _choice(ctx: ServingContext, request: CompletionRequest, index: int, prompt_text: str,
            text: str, token_ids: list[int], logprobs, finish_reason, offset: int = 0) -> dict:
    lp = None
    if request.logprobs is not None and logprobs is not None:
        lp = completion_logprobs(ctx.token_text, token_ids, logprobs, request.logprobs, offset)
    return {"index": index, "text": prompt_text + text, "logprobs": lp, "finish_reason": finish_reason}


def _echo(ctx: ServingContext, request: CompletionRequest, prompt: tuple[str | None, list[int]]) -> str:
    if not request.echo:
        return ""
    text, token_ids = prompt
    return text if text is not None else ctx.tokenizer.decode(token_ids)


def _response(ctx: ServingContext, request: CompletionRequest, prompts, outputs: list[RequestOutput],
              meta: dict) -> dict:
    choices = [_choice(ctx, request, i * request.n + c.index, _echo(ctx, request, prompts[i]), c.text,
                       c.token_ids, c.logprobs, c.finish_reason)
               for i, out in enumerate(outputs) for c in out.outputs]
    return {**meta, "object": "text_completion", "choices": choices, "usage": usage(outputs)}


async def _stream(ctx: ServingContext, request: CompletionRequest, prompts, streams,
                  meta: dict) -> AsyncIterator[dict]:
    include_usage = request.stream_options is not None and request.stream_options.include_usage
    extra = {"usage": None} if include_usage else {}
    tracker, last = DeltaTracker(), [None] * len(streams)
    async for i, out in merge(streams):
        last[i] = out
        for c in out.outputs:
            index = i * request.n + c.index
            d = tracker.delta(index, c)
            if d is None:
                continue
            echo = _echo(ctx, request, prompts[i]) if d.first else ""
            choice = _choice(ctx, request, index, echo, d.text, d.token_ids, d.logprobs, d.finish_reason,
                             d.offset)
            yield {**meta, "object": "text_completion", "choices": [choice], **extra}
    if include_usage:
        yield {**meta, "object": "text_completion", "choices": [], "usage": usage(last)}
