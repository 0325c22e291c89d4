"""The FastAPI app: routes, middlewares (CORS, API key, body size), error handlers."""
import asyncio
import copy
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import PlainTextResponse, Response

from gdserve.engine.async_llm import AsyncLLM
from gdserve.entrypoints.openai.errors import install_error_handlers
from gdserve.entrypoints.openai.limits import RequestLimits
from gdserve.entrypoints.openai.metrics import CONTENT_TYPE_LATEST, Metrics
from gdserve.entrypoints.openai.middleware import APIKeyMiddleware, BodyLimitMiddleware
from gdserve.entrypoints.openai.openapi import (MODEL_ROUTE, ChatCompletion, Completion, EmbeddingList,
                                                ModelList, responses)
from gdserve.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, EmbeddingRequest,
                                                 LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest)
from gdserve.entrypoints.openai.serving import ServingContext, now
from gdserve.entrypoints.openai.serving_models import ServingModels
from gdserve.entrypoints.openai.serving_chat import create_chat_completion
from gdserve.entrypoints.openai.serving_completion import create_completion
from gdserve.entrypoints.openai.serving_embedding import create_embedding


def build_app(engine: AsyncLLM, served_model_name: str, api_key: str | None = None,
              max_queue: int | None = None, chat_template: str | None = None,
              limits: RequestLimits | None = None, allowed_origins: list[str] | None = None,
              models: ServingModels | None = None, allow_runtime_lora: bool = False) -> FastAPI:
    """chat_template: a Jinja template overriding the tokenizer's. allowed_origins: CORS is off
    unless given. models: the LoRA adapters served beside the base model (loaded already);
    allow_runtime_lora adds the routes that load and unload them. The app shuts the engine down
    when it stops (uvicorn re-raises SIGTERM after its shutdown, so this is the last chance)."""
    limits = limits or RequestLimits()
    ctx = ServingContext(engine, copy.deepcopy(engine.tokenizer), served_model_name,
                         Metrics(engine, served_model_name), max_queue, chat_template, limits, models)
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="gdserve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.ctx = ctx
    install_error_handlers(app)
    add_http_middlewares(app, api_key, limits.max_request_bytes, allowed_origins)

    @app.get("/health", response_class=Response, responses={200: {"description": "the server is up"}})
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics", response_class=PlainTextResponse, responses=responses())
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", responses=responses(ok=ModelList))
    async def models() -> dict:
        return {"object": "list", "data": ctx.models.cards(now(), ctx.max_model_len)}

    @app.post("/v1/chat/completions", responses=responses(*MODEL_ROUTE, ok=ChatCompletion, streams=True))
    async def chat(request: ChatCompletionRequest, raw: Request):
        return await create_chat_completion(ctx, request, raw)

    @app.post("/v1/completions", responses=responses(*MODEL_ROUTE, ok=Completion, streams=True))
    async def completions(request: CompletionRequest, raw: Request):
        return await create_completion(ctx, request, raw)

    @app.post("/v1/embeddings", responses=responses(*MODEL_ROUTE, ok=EmbeddingList))
    async def embeddings(request: EmbeddingRequest):
        return await create_embedding(ctx, request)

    if allow_runtime_lora:
        _add_lora_routes(app, ctx.models)
    return app


def add_http_middlewares(app: FastAPI, api_key: str | None, max_request_bytes: int,
                         allowed_origins: list[str] | None) -> None:
    """What every request passes before its route: CORS, the API key, the body size."""
    # The last added runs first: CORS (so that errors carry its headers too), the key, the size.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    if api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])


def _add_lora_routes(app: FastAPI, models: ServingModels) -> None:
    """vLLM's runtime adapter routes; each answers 200 with a line of text."""
    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=responses(400))
    async def load_lora_adapter(request: LoadLoRAAdapterRequest) -> PlainTextResponse:
        lora = await models.load_lora_adapter(request.lora_name, request.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{lora.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=responses(400, 404))
    async def unload_lora_adapter(request: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        lora = await models.unload_lora_adapter(request.lora_name, request.lora_int_id)
        return PlainTextResponse(f"Success: LoRA adapter '{lora.lora_name}' removed successfully.")
