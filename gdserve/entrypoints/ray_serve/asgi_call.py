"""Serve one forwarded request with an ASGI app in this process, as a stream of a ResponseStart and
body chunks. Closing the stream early is a client disconnect for the app (it aborts the request)."""
import asyncio
from collections.abc import AsyncIterator

from starlette.types import ASGIApp, Message

from gdserve.entrypoints.ray_serve.forward import ForwardedRequest, ResponseStart

_DONE = {"type": "gdserve.app_done"}
_finishing: set[asyncio.Task] = set()  # apps that answered and still run their cleanup


async def call_asgi(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
    sent: asyncio.Queue[Message] = asyncio.Queue()
    disconnected = asyncio.Event()
    body = {"type": "http.request", "body": request.body, "more_body": False}

    async def receive() -> Message:
        nonlocal body
        if body is not None:
            message, body = body, None
            return message
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        try:
            await app(_scope(request), receive, sent.put)
        finally:
            sent.put_nowait(_DONE)

    task = asyncio.create_task(run())
    try:
        while True:
            message = await sent.get()
            if message is _DONE:
                await task  # raises the app's error when it failed before answering
                raise RuntimeError("the app ended without finishing its response")
            if message["type"] == "http.response.start":
                yield ResponseStart(message["status"], list(message.get("headers", [])))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    _finishing.add(task)
                    task.add_done_callback(_finishing.discard)
                    return
    finally:
        disconnected.set()
        if task not in _finishing:
            task.cancel()


def _scope(request: ForwardedRequest) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": request.method, "scheme": "http", "path": request.path, "raw_path": request.path.encode(),
            "query_string": request.query_string, "root_path": "", "headers": request.headers,
            "client": None, "server": None, "state": {}}
