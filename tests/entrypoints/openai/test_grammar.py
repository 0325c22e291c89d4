"""guided_grammar over HTTP (the OpenAI server with the default model): a built-in grammar and an
inline Lark grammar come back in their language; a bad grammar is a 400 naming the field."""
import json
import urllib.error
import urllib.request

import lark

from gdserve.grammar.cfg.lark_spec import load_grammar_text


def chat(server, **extra) -> tuple[int, dict]:
    body = {"model": "smollm2", "max_tokens": 40, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a sum of three numbers."}], **extra}
    request = urllib.request.Request(f"{server.url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_guided_grammar_over_http(smollm2_server):
    server = smollm2_server
    status, out = chat(server, guided_grammar="builtin:arithmetic")
    assert status == 200, out
    choice = out["choices"][0]
    if choice["finish_reason"] == "stop":
        lark.Lark(load_grammar_text("builtin:arithmetic"), parser="lalr").parse(
            choice["message"]["content"])
    status, out = chat(server, structured_outputs={"grammar": 'start: NUMBER ("+" NUMBER)*\n'
                                                              'NUMBER: /[0-9]+/'})
    assert status == 200, out
    assert all(p.isdigit() for p in out["choices"][0]["message"]["content"].split("+")), out
    status, out = chat(server, guided_grammar="start: 'a'")
    assert status == 400 and out["error"]["param"] == "guided_grammar", out
    assert "invalid Lark grammar" in out["error"]["message"], out
