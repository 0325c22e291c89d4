"""What the chat, completion and embedding handlers share: model and queue checks, the request to
SamplingParams mapping, constraint compilation, and running one engine request with metrics."""
import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass, field

from fastapi import Request

from gdserve.engine.async_llm import AsyncLLM, EngineDeadError, RequestFailed, RequestStream
from gdserve.entrypoints.openai.errors import APIError, bad_request, engine_failure
from gdserve.entrypoints.openai.limits import RequestLimits
from gdserve.entrypoints.openai.logprobs import TokenText
from gdserve.entrypoints.openai.metrics import Metrics, RequestTimer
from gdserve.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from gdserve.entrypoints.openai.serving_models import ServingModels
from gdserve.entrypoints.openai.structured import RESPONSE_FORMAT_SCHEMA, Constraint, guided_params
from gdserve.grammar import Grammar, GrammarError
from gdserve.grammar.service import CompilerUnavailableError
from gdserve.lora.request import LoRARequest
from gdserve.outputs import RequestOutput
from gdserve.sampling_params import StructuredOutputsParams, SamplingParams


@dataclass
class ServingContext:
    engine: AsyncLLM
    tokenizer: object           # the front end's own copy: the engine thread uses the engine's
    served_model_name: str
    metrics: Metrics
    max_queue: int | None = None
    chat_template: str | None = None
    limits: RequestLimits = field(default_factory=RequestLimits)
    models: ServingModels | None = None  # None: the base model alone
    token_text: TokenText = field(init=False)

    def __post_init__(self) -> None:
        self.token_text = TokenText(self.tokenizer)
        if self.models is None:
            self.models = ServingModels(self.engine, self.served_model_name)

    def resolve_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter a request's `model` names (None: the base model); a 404 for an unknown name."""
        return self.models.lora_request(model)

    def check_queue(self, num_requests: int) -> None:
        if self.max_queue is not None and self.engine.num_active_requests + num_requests > self.max_queue:
            raise APIError(429, f"the server is at its request limit ({self.max_queue} waiting or "
                                "running); retry later", code="queue_full")

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len


def encode_prompts(ctx: ServingContext, prompts: object, param: str) -> list[tuple[str | None, list[int]]]:
    """(text, token ids) per prompt of a `prompt` / `input` field: a string, a list of strings,
    token ids, or lists of them. A 400 when empty or past the limit on prompts per request."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not prompts:
        raise bad_request(f"{param} is empty", param)
    ctx.limits.check_inputs(len(prompts), param)
    return [(p, ctx.tokenizer.encode(p)) if isinstance(p, str) else (None, list(p)) for p in prompts]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def sampling_params(request: SamplingRequest, max_tokens: int | None, logprobs: int | None,
                    best_of: int | None = None) -> SamplingParams:
    """The request's sampling fields as SamplingParams; a bad value is a 400 naming the field."""
    if request.stream_options is not None and not request.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    optional = dict(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                    min_p=request.min_p, presence_penalty=request.presence_penalty,
                    frequency_penalty=request.frequency_penalty,
                    repetition_penalty=request.repetition_penalty)
    try:
        return SamplingParams(
            n=request.n, best_of=best_of, max_tokens=max_tokens, stop=request.stop, seed=request.seed,
            logit_bias=request.logit_bias, min_tokens=request.min_tokens, ignore_eos=request.ignore_eos,
            stop_token_ids=request.stop_token_ids, skip_special_tokens=request.skip_special_tokens,
            include_stop_str_in_output=request.include_stop_str_in_output, logprobs=logprobs,
            **{k: v for k, v in optional.items() if v is not None})
    except ValueError as e:
        raise bad_request(str(e), _field_of(str(e))) from None


_REQUEST_FIELDS = frozenset(ChatCompletionRequest.model_fields) | frozenset(CompletionRequest.model_fields)


def _field_of(message: str) -> str | None:
    """The request field a SamplingParams or engine message starts with ("top_p must be ...")."""
    word = message.split(" ", 1)[0].split("[", 1)[0]
    return word if word in _REQUEST_FIELDS else None


async def compile_constraint(ctx: ServingContext, request: SamplingRequest) -> Constraint:
    """The request's guided_* / structured_outputs / response_format constraint; a 400 naming the
    field when it does not compile."""
    guided, param = guided_params(request)
    if guided is None:
        return Constraint()
    try:
        grammar = await compile_guided(ctx, guided)
    except GrammarError as e:
        raise bad_request(f"invalid {param}: {e}", param) from None
    return Constraint(grammar, {RESPONSE_FORMAT_SCHEMA: list(grammar.relaxed)} if guided.lenient else {})


async def compile_guided(ctx: ServingContext, guided: StructuredOutputsParams) -> Grammar:
    """Compile off the loop, recording the time; raises GrammarError (a JSON Schema past the
    server's size limits among them)."""
    if guided.kind == "json":
        ctx.limits.check_schema(guided.spec)
    start = time.monotonic()
    try:
        grammar, hit = await ctx.engine.compile(guided)
    except CompilerUnavailableError as e:  # not the constraint's fault: a 503, not a 400
        raise APIError(503, f"the grammar compiler is unavailable: {e}; retry the request",
                       code="grammar_compiler_unavailable") from None
    except EngineDeadError as e:
        raise engine_failure(e) from None
    ctx.metrics.observe_compile(time.monotonic() - start, hit)
    return grammar


async def start_request(ctx: ServingContext, request_id: str, prompt_token_ids: list[int],
                        params: SamplingParams, prompt: str | None, grammar: Grammar | None,
                        lora_request: LoRARequest | None = None) -> RequestStream:
    """Queue one engine request (a prompt the engine refuses is a 400); its stream records
    latency metrics as it is read."""
    timer = RequestTimer(ctx.metrics)
    try:
        return await ctx.engine.add_request(request_id, prompt_token_ids, params, prompt, grammar,
                                            on_output=timer.update, lora_request=lora_request)
    except ValueError as e:  # the engine's messages start with the field at fault
        raise bad_request(str(e), _field_of(str(e))) from None
    except EngineDeadError as e:
        raise engine_failure(e) from None


async def start_all(ctx: ServingContext, request_id: str, prompts: list[tuple[str | None, list[int]]],
                    params: SamplingParams, grammar: Grammar | None,
                    lora_request: LoRARequest | None = None) -> list[RequestStream]:
    """One engine request per prompt (ids request_id-i when there are several); if one is
    refused, the ones already queued are aborted."""
    streams: list[RequestStream] = []
    try:
        for i, (text, token_ids) in enumerate(prompts):
            rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            streams.append(await start_request(ctx, rid, token_ids, params, text, grammar, lora_request))
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    return streams


async def collect(streams: list[RequestStream]) -> list[RequestOutput]:
    """The final output of each stream."""
    last: list[RequestOutput | None] = [None] * len(streams)
    try:
        async for i, out in merge(streams):
            last[i] = out
    except (RequestFailed, EngineDeadError) as e:
        raise engine_failure(e) from None
    return last


def usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(o.num_prompt_tokens for o in outputs)
    completion = sum(o.num_generated_tokens for o in outputs)
    forced = sum(c.num_forced_tokens for o in outputs for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outputs)},
            "completion_tokens_details": {"forced_tokens": forced}}


async def merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(index, item) from several async iterators as items arrive; closes them all on exit."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, it: AsyncIterator) -> None:
        try:
            async with aclosing(it):
                async for item in it:
                    await queue.put((i, item))
            await queue.put((i, done))
        except BaseException as e:  # noqa: BLE001  (re-raised in the consumer)
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def abort_on_disconnect(request: Request, work: Awaitable):
    """Await work, cancelling it (which aborts its engine requests) if the client goes away."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait([task])  # a cancel is only a request: let it (and its aborts) run
    if task.cancelled():
        raise APIError(499, "the client disconnected")
    return task.result()
