"""Bad input through the HTTP API. Each case of the matrix gets the right 4xx and an OpenAI error JSON
whose message names the problem, and the server answers the next request. Then the cases whose point
is time: bodies over the size limit, pathological regexes. Last, nothing is left allocated."""
import http.client
import json
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import openai
import pytest

MSG = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
MAX_REQUEST_BYTES = 4 << 20  # the server's default --max-request-bytes
COMPILE_TIMEOUT_S = 10.0  # the server's default --grammar-compile-timeout-s
TOOL_F = {"type": "function", "function": {"name": "f"}}
LEAKS = re.compile(r'Traceback|File "|\.py\b|site-packages')  # what an error message must never show


@dataclass(frozen=True)
class Bad:
    """One bad request and the answer it must get."""
    name: str
    body: dict | bytes
    status: int
    words: tuple[str, ...]     # each one in the error message
    param: str | None = None   # the error's param (not checked when None)
    path: str = CHAT


def chat(**fields) -> dict:
    """A small chat request with `fields` changed; a field set to None is left out."""
    body = {"messages": MSG, "max_tokens": 4, **fields}
    return {k: v for k, v in body.items() if v is not None}


def nested_schema(levels: int) -> dict:
    """An object in an object ... `levels` deep: two JSON containers per level."""
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def wide_schema(num_properties: int) -> dict:
    return {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(num_properties)}}


MALFORMED = [  # 422: the body is not JSON, or not the request's shape
    Bad("malformed JSON", b'{"messages": [', 422, ("not valid JSON",)),
    Bad("non-UTF-8 body", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 422, ("not valid UTF-8",)),
    Bad("JSON nested too deeply", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 422,
        ("nests too deeply",)),
    Bad("body not an object", b"[1, 2]", 422, ("body",)),
    Bad("NaN is not JSON", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 422,
        ("finite number",), "temperature"),
    Bad("wrong type: temperature", chat(temperature="hot"), 422, ("temperature",), "temperature"),
    Bad("wrong type: n", chat(n="two"), 422, ("n: Input should be a valid integer",), "n"),
    Bad("wrong type: messages", chat(messages="hi"), 422, ("messages",), "messages"),
    Bad("missing messages", chat(messages=None), 422, ("messages: Field required",), "messages"),
    Bad("missing prompt", {"max_tokens": 1}, 422, ("prompt: Field required",), "prompt", COMPLETIONS),
    Bad("unknown role", chat(messages=[{"role": "wizard", "content": "x"}]), 422, ("role",)),
    Bad("unknown response_format type", chat(response_format={"type": "xml"}), 422, ("response_format",)),
]

VALUES = [  # 400: a value out of range or past a server limit; 404: an unknown model
    Bad("empty messages", chat(messages=[]), 400, ("messages must not be empty",), "messages"),
    Bad("prompt longer than the context", chat(messages=[{"role": "user", "content": "x" * 300}]), 400,
        ("max_model_len is 128",), "prompt"),
    Bad("completion prompt longer than the context", {"prompt": "x" * 300, "max_tokens": 1}, 400,
        ("300 tokens",), "prompt", COMPLETIONS),
    Bad("prompt token id past the vocabulary", {"prompt": [999999], "max_tokens": 1}, 400, ("vocabulary",),
        "prompt", COMPLETIONS),
    Bad("max_tokens 0", chat(max_tokens=0), 400, ("max_tokens must be >= 1",), "max_tokens"),
    Bad("max_tokens negative", chat(max_tokens=-1), 400, ("max_tokens must be >= 1",), "max_tokens"),
    Bad("max_tokens above the context", chat(max_tokens=10_000), 400, ("max_tokens 10000", "max_model_len 128"),
        "max_tokens"),
    Bad("max_completion_tokens 0", chat(max_completion_tokens=0), 400, ("max_tokens must be >= 1",)),
    Bad("n 0", chat(n=0), 400, ("n must be >= 1",), "n"),
    Bad("n above --max-n", chat(n=17), 400, ("n must be <= 16", "--max-n"), "n"),
    Bad("n above --max-n, completions", {"prompt": "x", "max_tokens": 1, "n": 10**6}, 400, ("--max-n",), "n",
        COMPLETIONS),
    Bad("negative temperature", chat(temperature=-1), 400, ("temperature must be >= 0",), "temperature"),
    Bad("top_p 0", chat(top_p=0), 400, ("top_p must be in (0, 1]",), "top_p"),
    Bad("top_p above 1", chat(top_p=1.5), 400, ("top_p must be in (0, 1]",), "top_p"),
    Bad("presence_penalty out of range", chat(presence_penalty=5), 400, ("presence_penalty",), "presence_penalty"),
    Bad("negative top_k", chat(top_k=-5), 400, ("top_k",), "top_k"),
    Bad("seed past 64 bits", chat(seed=2**64), 400, ("seed must be a 64-bit",), "seed"),
    Bad("logit_bias key not a token id", chat(logit_bias={"x": 1}), 400, ("logit_bias keys",), "logit_bias"),
    Bad("logit_bias negative token id", chat(logit_bias={"-1": 1}), 400, ("non-negative token ids",), "logit_bias"),
    Bad("logit_bias token id past the vocabulary", chat(logit_bias={"259": 1}), 400, ("[259]", "vocabulary"),
        "logit_bias"),
    Bad("logit_bias above 100", chat(logit_bias={"5": 101}), 400, ("[-100, 100]",), "logit_bias"),
    Bad("logit_bias below -100", chat(logit_bias={"5": -101}), 400, ("[-100, 100]",), "logit_bias"),
    Bad("too many stop sequences", chat(stop=[str(i) for i in range(17)]), 400, ("at most 16 sequences",), "stop"),
    Bad("stop sequence too long", chat(stop="x" * 257), 400, ("at most 256 characters",), "stop"),
    Bad("empty stop sequence", chat(stop=[""]), 400, ("non-empty",), "stop"),
    Bad("stop_token_ids past the vocabulary", chat(stop_token_ids=[1000]), 400, ("vocabulary",), "stop_token_ids"),
    Bad("top_logprobs without logprobs", chat(top_logprobs=2), 400, ("needs logprobs",), "top_logprobs"),
    Bad("top_logprobs above 20", chat(logprobs=True, top_logprobs=21), 400, ("[0, 20]",)),
    Bad("stream_options without stream", chat(stream_options={"include_usage": True}), 400, ("stream",),
        "stream_options"),
    Bad("image content", chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400, ("image_url",)),
    Bad("suffix", {"prompt": "x", "suffix": "y"}, 400, ("suffix",), "suffix", COMPLETIONS),
    Bad("echo with logprobs", {"prompt": "x", "echo": True, "logprobs": 1}, 400, ("echo",), "echo", COMPLETIONS),
    Bad("empty embedding input", {"input": []}, 400, ("empty",), "input", EMBEDDINGS),
    Bad("too many prompts", {"prompt": [[65]] * 2049, "max_tokens": 1}, 400, ("at most 2048 prompts",), "prompt",
        COMPLETIONS),
    Bad("too many embedding inputs", {"input": ["x"] * 2049}, 400, ("at most 2048 prompts",), "input", EMBEDDINGS),
    Bad("unknown model", chat(model="gpt-9"), 404, ("gpt-9",), "model"),
]

CONSTRAINTS = [  # 400: a constraint that is contradictory, unsupported, too large, or does not compile
    Bad("two constraints", chat(guided_regex="[0-9]+", guided_choice=["a"]), 400,
        ("at most one", "guided_regex", "guided_choice")),
    Bad("guided_json and response_format",
        chat(guided_json={"type": "string"}, response_format={"type": "json_object"}), 400, ("at most one",)),
    Bad("structured_outputs with two kinds", chat(structured_outputs={"regex": "a", "choice": ["b"]}), 400,
        ("exactly one",), "structured_outputs"),
    Bad("whitespace pattern without JSON", chat(guided_regex="a+", guided_whitespace_pattern=" "), 400,
        ("whitespace",), "guided_whitespace_pattern"),
    Bad("open objects without JSON",
        chat(structured_outputs={"regex": "a+", "disable_additional_properties": False}), 400,
        ("disable_additional_properties", "json"), "structured_outputs"),
    Bad("json_schema without a schema", chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400, ("json_schema.schema",), "response_format"),
    Bad("invalid regex", chat(guided_regex="(a"), 400, ("cannot compile regex '(a'",), "guided_regex"),
    Bad("regex lookbehind", chat(guided_regex="(?<=a)b"), 400, ("look",), "guided_regex"),
    Bad("unsupported schema keyword",
        chat(guided_json={"type": "object", "properties": {"a": {"not": {"pattern": "^a"}}}}), 400,
        ("'not'", "/properties/a"), "guided_json"),
    Bad("schema minimum above maximum", chat(guided_json={"type": "integer", "minimum": 5, "maximum": 1}), 400,
        ("unsatisfiable",), "guided_json"),
    Bad("schema enum against its type", chat(guided_json={"type": "integer", "enum": ["a"]}), 400,
        ("unsatisfiable",), "guided_json"),
    Bad("schema with a remote $ref", chat(guided_json={"$ref": "https://example.com/s.json"}), 400,
        ("remote $ref", "never fetched"), "guided_json"),
    Bad("schema with a file $ref", chat(guided_json={"$ref": "file:///etc/passwd"}), 400,
        ("remote $ref", "never fetched"), "guided_json"),
    Bad("schema text not JSON", chat(guided_json="{not json"), 400, ("not valid JSON",), "guided_json"),
    Bad("schema text nested too deeply", chat(guided_json="[" * 5000 + "]" * 5000), 400, ("nests too deeply",),
        "guided_json"),
    Bad("schema deeper than the limit", chat(guided_json=nested_schema(40)), 400, ("more than 64 deep",),
        "guided_json"),
    Bad("schema larger than the limit", chat(guided_json=wide_schema(30_000)), 400, ("more than 50000 values",),
        "guided_json"),
    Bad("grammar that does not parse", chat(guided_grammar="start: 'a'"), 400, ("invalid Lark grammar",),
        "guided_grammar"),
    Bad("grammar importing a file", chat(guided_grammar="%import .secret (S)\nstart: S"), 400,
        ("cannot %import 'secret'",), "guided_grammar"),
    Bad("built-in grammar outside its folder", chat(guided_grammar="builtin:../../etc/passwd"), 400,
        ("unknown built-in grammar",), "guided_grammar"),
    Bad("empty guided_choice", chat(guided_choice=[]), 400, ("non-empty",), "guided_choice"),
    Bad("tool_choice names an unknown tool",
        chat(tools=[TOOL_F], tool_choice={"type": "function", "function": {"name": "g"}}), 400, ("'g'",),
        "tool_choice"),
    Bad("tool_choice without tools", chat(tool_choice="required"), 400, ("needs tools",), "tool_choice"),
    Bad("tool parameters unsatisfiable",
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "minimum": 3,
                                                                                   "maximum": 1}}}],
             tool_choice="required"),
        400, ("tools[0].function.parameters", "'f'", "unsatisfiable"), "tools"),
]


def assert_error(status: int, body: dict, expected: int, *words: str, param: str | None = None) -> None:
    assert status == expected, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["type"], str)
    for word in words:
        assert word in error["message"], (word, error["message"])
    if param is not None:
        assert error["param"] == param, error
    assert not LEAKS.search(error["message"]), error["message"]


def assert_serves(server) -> None:
    status, body = server.post(COMPLETIONS, {"prompt": "ok", "max_tokens": 1})
    assert status == 200 and len(body["choices"]) == 1, body


@pytest.mark.parametrize("case", MALFORMED + VALUES + CONSTRAINTS, ids=lambda c: c.name)
def test_bad_request_gets_a_clear_error(tiny_server, case):
    status, body = tiny_server.post(case.path, case.body)
    assert_error(status, body, case.status, *case.words, param=case.param)
    assert_serves(tiny_server)


def raw_post(server, chunks: list[bytes], headers: dict) -> tuple[int, dict]:
    """POST exactly these bytes after these headers (http.client adds neither a length nor a body)."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.putrequest("POST", COMPLETIONS)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            conn.putheader(name, value)
        conn.endheaders()
        for chunk in chunks:
            conn.send(chunk)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_body_over_the_limit_is_refused_unread(tiny_server):
    """A Content-Length over the limit is a 413 at once, before a byte of the body is sent."""
    start = time.monotonic()
    status, body = raw_post(tiny_server, [], {"Content-Length": str(1 << 30)})
    assert_error(status, body, 413, str(MAX_REQUEST_BYTES), "--max-request-bytes")
    assert time.monotonic() - start < 5
    assert_serves(tiny_server)


def test_chunked_body_over_the_limit_is_413(tiny_server):
    """Without a Content-Length the bytes are counted as they arrive; just under the limit passes."""
    def chunked(size: int) -> list[bytes]:
        request = {"prompt": "ok", "max_tokens": 1, "pad": ""}
        request["pad"] = "x" * (size - len(json.dumps(request)))
        body = json.dumps(request).encode()
        pieces = [body[i:i + (1 << 16)] for i in range(0, len(body), 1 << 16)]
        return [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]

    status, body = raw_post(tiny_server, chunked(MAX_REQUEST_BYTES + 1), {"Transfer-Encoding": "chunked"})
    assert_error(status, body, 413, str(MAX_REQUEST_BYTES))
    status, body = raw_post(tiny_server, chunked(MAX_REQUEST_BYTES), {"Transfer-Encoding": "chunked"})
    assert status == 200, body


@pytest.mark.parametrize("regex", [
    "(a+)+$", "(a|aa)*b", "(.*a){20}",  # backtracking traps: a DFA has none
    "[ab]*a[ab]{20}",  # a DFA of 2^21 states, built only where the output goes
])
def test_pathological_regex_answers_in_bounded_time(tiny_server, regex):
    start = time.monotonic()
    got, body = tiny_server.post(CHAT, chat(guided_regex=regex, max_tokens=32))
    assert time.monotonic() - start < COMPILE_TIMEOUT_S + 20
    assert got == 200, body
    assert_serves(tiny_server)


def test_max_tokens_below_the_shortest_output_is_a_400_naming_the_minimum(tiny_server):
    got, body = tiny_server.post(CHAT, chat(guided_regex="[0-9]{12}", max_tokens=4))
    assert_error(got, body, 400, "max_tokens 4", "at least 13", param="max_tokens")


def test_server_survives_bad_requests(tiny_server):
    r = tiny_server.client().completions.create(model=tiny_server.model, prompt="ok", max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert tiny_server.metric("gdserve_kv_cache_used_blocks") == 0


def test_queue_full_is_429(guarded_server):
    s = guarded_server
    client = s.client()
    long = client.chat.completions.create(model=s.model, messages=MSG, max_tokens=2000, stream=True,
                                          extra_body={"ignore_eos": True})
    next(iter(long))  # the request is in flight
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model=s.model, messages=MSG, max_tokens=2)
    assert "limit" in str(e.value)
    long.close()
    deadline = time.monotonic() + 20
    while s.metric("gdserve_num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    r = client.chat.completions.create(model=s.model, messages=MSG, max_tokens=2)
    assert r.choices[0].message.content is not None
