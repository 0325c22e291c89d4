"""Security at the HTTP boundary: the API key on every path but /health, CORS only when asked for,
constraints that never reach the network or the filesystem, 500s that show nothing of the server."""
import ast
import json
import re
import socket
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from gdserve.entrypoints.openai.errors import install_error_handlers

MSG = [{"role": "user", "content": "hi"}]
ORIGIN = "https://app.example"  # tiny_keyed_server's --allowed-origins
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
GUARDED = [
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("POST", "/v1/chat/completions", {"messages": MSG, "max_tokens": 1}),
    ("POST", "/v1/completions", {"prompt": "ok", "max_tokens": 1}),
    ("POST", "/v1/embeddings", {"input": "ok"}),
    ("GET", "/no-such-path", None),
]


def call(server, method: str, path: str, body: dict | None = None,
         headers: dict | None = None) -> tuple[int, Message, bytes]:
    """One request with exactly these headers: (status, response headers, body)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@pytest.mark.parametrize("method,path,body", GUARDED, ids=[f"{m} {p}" for m, p, _ in GUARDED])
def test_api_key_guards_every_path_but_health(tiny_keyed_server, method, path, body):
    s = tiny_keyed_server
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
        status, _, raw = call(s, method, path, body, headers)
        assert status == 401, (headers, raw)
        assert json.loads(raw)["error"]["code"] == "invalid_api_key"
    status, _, raw = call(s, method, path, body, {"Authorization": "Bearer sekrit"})
    assert status == (404 if path == "/no-such-path" else 200), raw


def test_health_needs_no_key(tiny_keyed_server):
    assert call(tiny_keyed_server, "GET", "/health")[0] == 200


def test_cors_is_off_by_default(tiny_server):
    status, headers, _ = call(tiny_server, "OPTIONS", "/v1/chat/completions", headers={"Origin": ORIGIN, **PREFLIGHT})
    assert status == 405 and "access-control-allow-origin" not in headers
    status, headers, _ = call(tiny_server, "GET", "/v1/models", headers={"Origin": ORIGIN})
    assert status == 200 and "access-control-allow-origin" not in headers


def test_cors_answers_the_allowed_origins_only(tiny_keyed_server):
    s = tiny_keyed_server
    status, headers, _ = call(s, "OPTIONS", "/v1/chat/completions", headers={"Origin": ORIGIN, **PREFLIGHT})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN  # a preflight carries no key
    assert "authorization" in headers["access-control-allow-headers"].lower()
    status, headers, _ = call(s, "GET", "/v1/models", headers={"Origin": ORIGIN, "Authorization": "Bearer sekrit"})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    status, headers, _ = call(s, "GET", "/v1/models", headers={"Origin": ORIGIN})
    assert status == 401 and headers["access-control-allow-origin"] == ORIGIN  # the page can read the error
    other = "https://evil.example"
    status, headers, _ = call(s, "OPTIONS", "/v1/chat/completions", headers={"Origin": other, **PREFLIGHT})
    assert status == 400 and "access-control-allow-origin" not in headers
    status, headers, _ = call(s, "GET", "/v1/models", headers={"Origin": other, "Authorization": "Bearer sekrit"})
    assert status == 200 and "access-control-allow-origin" not in headers


def test_schema_refs_are_never_fetched(tiny_server, tmp_path):
    """A $ref to a URL, a file or a relative path is a 400: no connection is made, no file read."""
    schema_file = tmp_path / "schema.json"
    schema_file.write_text('{"type": "integer"}')
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        for ref in (f"http://127.0.0.1:{port}/schema.json", schema_file.as_uri(), "schema.json"):
            status, body = tiny_server.post("/v1/chat/completions", {"messages": MSG, "max_tokens": 1,
                                                                     "guided_json": {"$ref": ref}})
            assert status == 400 and "never fetched" in body["error"]["message"], (ref, body)
        with pytest.raises(TimeoutError):
            listener.accept()


def test_request_handling_code_has_no_eval():
    """A supplement to the $ref and %import tests: no eval, exec, compile() or __import__ in the code
    that handles request content (the server and the constraint compilers)."""
    root = Path(__file__).parents[3]
    sources = [*(root / "grammar").glob("*.py"), *(root / "gdserve/entrypoints/openai").glob("*.py")]
    assert len(sources) > 20
    for path in sources:
        calls = {node.func.id for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        assert not calls & {"eval", "exec", "compile", "__import__"}, path


def test_internal_error_shows_only_an_id(caplog):
    """A 500's body names no exception, path or traceback; the id finds the traceback in the log."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom():
        raise RuntimeError(f"secret state in {__file__}")

    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "internal_server_error"
    for leak in ("secret", "RuntimeError", "Traceback", ".py", "/"):
        assert leak not in error["message"], error["message"]
    error_id = re.fullmatch(r"internal server error \(error id (\w+); the server log has the details\)",
                            error["message"])[1]
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged and logged[0].exc_info[0] is RuntimeError
