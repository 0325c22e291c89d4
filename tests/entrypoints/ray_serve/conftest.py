"""One Ray local cluster for the module: the tiny model on 2 CPU replicas behind the ingress, built
from `serve run` config args (the same path as a config file), behind an API key."""
import socket
from dataclasses import dataclass

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from gdserve.entrypoints.ray_serve.app import build_app  # noqa: E402

from tests.entrypoints.openai.conftest import CHATML  # noqa: E402

API_KEY = "sekrit"
PREFIX_CHARS = 48  # the tiny model's context is 128 byte tokens


@dataclass
class RayServer:
    url: str
    model: str = "tiny"

    def client(self, api_key: str | None = API_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_server(tiny_llama_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "chatml.jinja"
    template.write_text(CHATML)
    port = _free_port()
    ray.init(num_cpus=4, include_dashboard=False, logging_level="warning")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app({"model": str(tiny_llama_dir), "replicas": 2, "served_model_name": "tiny",
                         "chat_template": str(template), "kv_cache_memory": 8_000_000,
                         "grammar_compile_workers": 1, "api_key": API_KEY, "max_request_bytes": 100_000,
                         "ray_prefix_chars": PREFIX_CHARS})
        serve.run(app, name="gdserve", route_prefix="/")
        yield RayServer(f"http://127.0.0.1:{port}")
    finally:
        serve.shutdown()
        ray.shutdown()
