"""The ingress: every HTTP request passes gdserve's edge (API key, CORS, body size) here and goes
whole, with its prefix key, to the engine replica the router picks; the replica's answer comes back
as it streams. A replica that fails before answering is a 503; one that fails mid-stream ends the
stream with an error event and [DONE], as gdserve's own streams end on a failure."""
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from gdserve.entrypoints.openai.app import add_http_middlewares
from gdserve.entrypoints.openai.errors import error_body, error_response, install_error_handlers
from gdserve.entrypoints.openai.sse import frame
from gdserve.entrypoints.ray_serve.forward import ForwardedRequest, ResponseStart, prefix_key

logger = logging.getLogger(__name__)

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
_REPLICA_FAILED = "the engine replica serving this request failed; retry"


@serve.ingress()
class Ingress:
    def __init__(self, engine: DeploymentHandle, api_key: str | None, max_request_bytes: int,
                 allowed_origins: list[str] | None, prefix_chars: int):
        self.engine = engine.options(stream=True)
        self.edge = (api_key, max_request_bytes, allowed_origins)
        self.prefix_chars = prefix_chars

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = FastAPI(title="gdserve", docs_url=None, redoc_url=None, openapi_url=None)
        install_error_handlers(app)
        add_http_middlewares(app, *self.edge)
        app.add_api_route("/{path:path}", self.relay, methods=_METHODS, include_in_schema=False)
        return app

    async def relay(self, request: Request) -> Response:
        body = await request.body()
        forwarded = ForwardedRequest(request.method, request.url.path, request.scope["query_string"],
                                     list(request.scope["headers"]), body, prefix_key(body, self.prefix_chars))
        # Positional: the router reads the first argument.
        stream: DeploymentResponseGenerator = self.engine.forward.remote(forwarded)
        try:
            start: ResponseStart = await stream.__anext__()
            if start.is_event_stream:
                return _streaming_response(start, stream)
            content = b"".join([chunk async for chunk in stream])
        except Exception as e:  # noqa: BLE001  (the replica died, or Ray lost it)
            stream.cancel()
            logger.warning("replica failed a request: %r", e)
            return error_response(503, _REPLICA_FAILED, code="engine_unavailable")
        response = Response(content, status_code=start.status)
        response.raw_headers = start.headers
        return response


def _streaming_response(start: ResponseStart, stream: DeploymentResponseGenerator) -> StreamingResponse:
    response = StreamingResponse(_relay_events(stream), status_code=start.status)
    response.raw_headers = start.headers
    return response


async def _relay_events(stream: DeploymentResponseGenerator) -> AsyncIterator[bytes]:
    finished = False
    try:
        async for chunk in stream:
            yield chunk
        finished = True
    except Exception as e:  # noqa: BLE001  (headers are sent: report in-band, as gdserve's streams do)
        logger.warning("replica failed mid-stream: %r", e)
        yield frame(error_body(503, _REPLICA_FAILED, code="engine_unavailable")).encode()
        yield b"data: [DONE]\n\n"
        finished = True
    finally:
        if not finished:  # the client left: stop the replica's request too
            stream.cancel()
