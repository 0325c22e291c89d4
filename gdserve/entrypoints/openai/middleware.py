"""Plain ASGI middlewares (streaming responses and disconnects pass through untouched): the API key
check and the request body size limit."""
import secrets

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gdserve.entrypoints.openai.errors import error_response

OPEN_PATHS = frozenset({"/health"})


class APIKeyMiddleware:
    """401 without `Authorization: Bearer KEY` on every path but /health (/metrics and the OpenAPI
    document included); the key is compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                response = error_response(401, "missing or invalid API key (send Authorization: "
                                               "Bearer KEY)", code="invalid_api_key")
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class BodyTooLarge(HTTPException):
    """Raised from receive(): FastAPI lets an HTTPException out of its body parsing unchanged, so
    the error handlers answer it as a 413."""

    def __init__(self, max_bytes: int):
        super().__init__(413, f"the request body is larger than the server's limit of {max_bytes} bytes "
                              "(--max-request-bytes)")


class BodyLimitMiddleware:
    """413 for a body over max_bytes: refused on its Content-Length before any of it is read, and,
    for a body without one (chunked), as soon as the bytes received pass the limit. Nothing over
    the limit is ever buffered."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = BodyTooLarge(self.max_bytes)
        if _content_length(scope) > self.max_bytes:
            response = error_response(413, too_large.detail)
            return await response(scope, receive, send)
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large
            return message

        await self.app(scope, counting_receive, send)


def _content_length(scope: Scope) -> int:
    """The declared body size; 0 when absent or unreadable (uvicorn refuses a malformed one)."""
    value = dict(scope["headers"]).get(b"content-length", b"")
    return int(value) if value.isdigit() else 0
