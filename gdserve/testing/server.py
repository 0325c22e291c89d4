"""A `gdserve serve` subprocess on a free local port: start it, wait for /health, stop it."""
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_TAIL_CHARS = 3000


@dataclass
class GdserveServer:
    base_url: str               # http://127.0.0.1:PORT/v1, what OpenAI clients take
    model: str                  # the served model id, for `model=` in requests
    process: subprocess.Popen
    log_path: Path              # the server's stdout and stderr
    client: Any = field(default=None, repr=False)  # an openai.OpenAI pointed at base_url

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.client is not None:
            self.client.close()
        return self.process.returncode


def _openai_client(base_url: str, api_key: str):
    try:
        import openai
    except ImportError:
        raise ImportError("the gdserve_server fixture needs the openai package: pip install openai") from None
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, api_key: str) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def _api_key(args: list[str]) -> str:
    for i, arg in enumerate(args):
        if arg == "--api-key" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--api-key="):
            return arg.split("=", 1)[1]
    return "unused"


def start_server(model: str | None, args: list[str], log_path: Path, timeout_s: float = 300.0) -> GdserveServer:
    """Start `gdserve serve [MODEL] --port FREE ARGS...` and wait until /health answers. `model` None
    serves the default model. Raises RuntimeError with the server's output tail if it exits or does
    not come up within `timeout_s`."""
    client_key = _api_key(args)
    port = _free_port()
    cmd = [sys.executable, "-m", "gdserve.entrypoints.cli", "serve", *([model] if model else []),
           "--host", "127.0.0.1", "--port", str(port), *args]
    base_url = f"http://127.0.0.1:{port}/v1"
    client = _openai_client(base_url, client_key)  # before starting: a missing openai fails at once
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = GdserveServer(base_url, model or "", proc, log_path, client)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gdserve serve exited with code {proc.returncode} before it was healthy:\n"
                               f"{server.log_tail()}")
        try:
            _get(f"http://127.0.0.1:{port}/health", client_key)
            break
        except OSError:
            time.sleep(0.2)
    else:
        server.stop()
        raise RuntimeError(f"gdserve serve did not answer /health within {timeout_s:g} s:\n{server.log_tail()}")
    try:
        server.model = json.loads(_get(f"{base_url}/models", client_key))["data"][0]["id"]
    except (OSError, ValueError, LookupError) as e:
        server.stop()
        raise RuntimeError(f"gdserve serve is healthy but GET /v1/models failed: {e}") from None
    return server
