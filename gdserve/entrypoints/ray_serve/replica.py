"""An engine replica: gdserve's own app and AsyncLLM in one Ray Serve replica, serving the requests
the ingress forwards to it in-process. The HTTP edge (API key, CORS, body size) is the ingress's."""
import argparse
import asyncio
import os
from collections.abc import AsyncIterator

from ray import serve

from gdserve.entrypoints.openai.lora_modules import RUNTIME_LORA_ENV
from gdserve.entrypoints.openai.server import build_server_app
from gdserve.entrypoints.ray_serve.asgi_call import call_asgi
from gdserve.entrypoints.ray_serve.forward import REPLICA_HEADER, ForwardedRequest, ResponseStart


class EngineReplica:
    async def __init__(self, args: argparse.Namespace, engine_kwargs: dict):
        behind_ingress = argparse.Namespace(**{**vars(args), "api_key": None, "allowed_origins": None})
        os.environ.pop(RUNTIME_LORA_ENV, None)  # an adapter loaded at runtime would reach this replica alone
        # build_server_app loads the model and runs its own event loop for the LoRA modules.
        self.app, self.engine = await asyncio.to_thread(build_server_app, behind_ingress, engine_kwargs)
        self.name = serve.get_replica_context().replica_id.to_full_id_str().encode()

    async def forward(self, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        async for item in call_asgi(self.app, request):
            if isinstance(item, ResponseStart):
                item = ResponseStart(item.status, [*item.headers, (REPLICA_HEADER, self.name)])
            yield item

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine has stopped is replaced."""
        if not self.engine.alive:
            raise RuntimeError("the engine has stopped")

    def __del__(self) -> None:
        if hasattr(self, "engine"):
            self.engine.shutdown()
