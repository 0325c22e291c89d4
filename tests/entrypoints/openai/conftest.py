"""Real `gdserve serve` subprocesses on 127.0.0.1, one per configuration, shared by the session."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# ChatML that takes `tools=` (names only: the tiny model's context is 128 tokens) and assistant
# `tool_calls`, so the server hands tools and calls to the template instead of the system prompt.
TOOLS_CHATML = ("{% if tools %}{{ '<|im_start|>system\\n' }}{% for t in tools %}{{ t['function']['name'] + ' ' }}"
                "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + "
                "'\\n' + m['content'] }}{% for c in m.get('tool_calls', []) %}{{ c['function']['name'] + "
                "(c['function']['arguments'] | tojson) }}{% endfor %}{{ '<|im_end|>\\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@dataclass
class Server:
    url: str            # http://127.0.0.1:PORT
    model: str          # the served model name
    api_key: str = "unused"

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(**{"base_url": f"{self.url}/v1", "api_key": self.api_key, "max_retries": 0, **kw})

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(**{"base_url": f"{self.url}/v1", "api_key": self.api_key, "max_retries": 0,
                                     **kw})

    def post(self, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict]:
        """POST raw JSON (or raw bytes); (status, parsed body)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}",
                   **(headers or {})}
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def get(self, path: str) -> str:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.api_key}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read().decode()

    def metric(self, name: str) -> float:
        for line in self.get("/metrics").splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, log_path: Path, *args: str, served_name: str = "test-model",
                 timeout_s: float = 120):
    """Start `gdserve serve` and wait for /health; returns (process, Server)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "gdserve.entrypoints.cli", "serve", str(model), "--port", str(port),
           "--served-model-name", served_name, "--log-level", "warning", *args]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    server = Server(f"http://127.0.0.1:{port}", served_name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            server.get("/health")
            return proc, server
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not come up in {timeout_s} s:\n{log_path.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def chat_template_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "chatml.jinja"
    path.write_text(CHATML)
    return path


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_dir, chat_template_file, tmp_path_factory):
    """The tiny random-weight Llama (byte tokenizer, context 128) with a ChatML template."""
    proc, server = start_server(tiny_llama_dir, tmp_path_factory.mktemp("logs") / "tiny.log",
                                "--chat-template", str(chat_template_file), "--kv-cache-memory", "8000000")
    yield server
    stop_server(proc)


@pytest.fixture(scope="session")
def tiny_tools_server(tiny_llama_dir, tmp_path_factory):
    """The tiny model with a chat template that takes tools and assistant tool_calls."""
    path = tmp_path_factory.mktemp("template") / "tools.jinja"
    path.write_text(TOOLS_CHATML)
    proc, server = start_server(tiny_llama_dir, tmp_path_factory.mktemp("logs") / "tiny_tools.log",
                                "--chat-template", str(path), "--kv-cache-memory", "8000000")
    yield server
    stop_server(proc)


@pytest.fixture(scope="session")
def tiny_keyed_server(tiny_llama_dir, chat_template_file, tmp_path_factory):
    """The tiny model behind an API key, with CORS for one origin."""
    proc, server = start_server(tiny_llama_dir, tmp_path_factory.mktemp("logs") / "tiny_keyed.log",
                                "--chat-template", str(chat_template_file), "--kv-cache-memory", "8000000",
                                "--api-key", "sekrit", "--allowed-origins", "https://app.example")
    server.api_key = "sekrit"
    yield server
    stop_server(proc)


@pytest.fixture(scope="session")
def guarded_server(smollm2_dir, tmp_path_factory):
    """The default model behind an API key, with room for one request at a time (the tiny model
    finishes any request too fast to hold the queue)."""
    proc, server = start_server(smollm2_dir, tmp_path_factory.mktemp("logs") / "guarded.log",
                                "--kv-cache-memory", str(256 << 20), "--max-model-len", "4096",
                                "--api-key", "sekrit", "--max-queue", "1")
    server.api_key = "sekrit"
    yield server
    stop_server(proc)


@pytest.fixture(scope="session")
def smollm2_server(smollm2_dir, tmp_path_factory):
    """The default model (its own chat template), for end-to-end structured outputs."""
    proc, server = start_server(smollm2_dir, tmp_path_factory.mktemp("logs") / "smollm2.log",
                                "--kv-cache-memory", str(512 << 20), "--max-model-len", "2048",
                                "--grammar-compile-timeout-s", "60", served_name="smollm2")
    yield server
    stop_server(proc)
