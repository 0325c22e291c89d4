"""Graceful shutdown on SIGTERM / SIGINT: stop accepting, let the requests in flight finish for a
grace period, then fail the ones still running, so every client gets an answer and the process exits.

uvicorn alone would cancel the handlers still running at its timeout, cutting their connections
(a stream without its [DONE]). Here the engine is shut down when the grace period ends instead:
each request still in flight fails with EngineDeadError, which its handler turns into a 503 (or,
in a stream already answering, an error event and [DONE]). uvicorn's own timeout stays as the
backstop for a handler stuck elsewhere.
"""
import asyncio
import socket

import uvicorn

from gdserve.engine.async_llm import AsyncLLM

# What the backstop adds to the grace period: the time for the failed requests' last bytes to go out.
_BACKSTOP_S = 2.0


class DrainingServer(uvicorn.Server):
    """A uvicorn.Server that drains for grace_s (it sets config.timeout_graceful_shutdown)."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, grace_s: float):
        config.timeout_graceful_shutdown = grace_s + _BACKSTOP_S
        super().__init__(config)
        self.engine = engine
        self.grace_s = grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown (it closes the listening sockets first), with the engine shut down
        grace_s into it if the responses in flight have not all finished by then."""
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.grace_s, lambda: loop.run_in_executor(None, self.engine.shutdown))
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
