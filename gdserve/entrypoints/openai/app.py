"""The FastAPI app: routes, the API key check, error handlers."""
import asyncio
import copy
import secrets
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

from gdserve.engine.async_llm import AsyncLLM
from gdserve.entrypoints.openai.errors import error_response, install_error_handlers
from gdserve.entrypoints.openai.metrics import CONTENT_TYPE_LATEST, Metrics
from gdserve.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from gdserve.entrypoints.openai.serving import ServingContext, now
from gdserve.entrypoints.openai.serving_chat import create_chat_completion
from gdserve.entrypoints.openai.serving_completion import create_completion
from gdserve.entrypoints.openai.serving_embedding import create_embedding


def build_app(engine: AsyncLLM, served_model_name: str, api_key: str | None = None,
              max_queue: int | None = None, chat_template: str | None = None) -> FastAPI:
    """chat_template: a Jinja template overriding the tokenizer's. The app shuts the engine down
    when it stops (uvicorn re-raises SIGTERM after its shutdown, so this is the last chance)."""
    ctx = ServingContext(engine, copy.deepcopy(engine.tokenizer), served_model_name,
                         Metrics(engine, served_model_name), max_queue, chat_template)
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="gdserve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.ctx = ctx
    install_error_handlers(app)
    if api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": served_model_name, "object": "model", "created": now(), "owned_by": "gdserve",
                "max_model_len": ctx.max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest, raw: Request):
        return await create_chat_completion(ctx, request, raw)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw: Request):
        return await create_completion(ctx, request, raw)

    @app.post("/v1/embeddings")
    async def embeddings(request: EmbeddingRequest):
        return await create_embedding(ctx, request)

    return app


class APIKeyMiddleware:
    """401 for /v1/* without `Authorization: Bearer KEY` (plain ASGI: streaming and
    disconnects pass through untouched)."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                response = error_response(401, "missing or invalid API key (send Authorization: "
                                               "Bearer KEY)", code="invalid_api_key")
                return await response(scope, receive, send)
        await self.app(scope, receive, send)
