"""Multi-LoRA through the server with the openai SDK: `model` picks an adapter (completions, chat,
streaming), outputs equal the offline engine's, /v1/models, runtime load/unload and the errors."""
import asyncio
import json
import shutil
import urllib.error
import urllib.request

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from gdserve import LLM, SamplingParams
from gdserve.lora import LoRARequest
from tests.entrypoints.openai.conftest import start_server, stop_server
from tests.helpers import save_peft_adapter

pytest.importorskip("peft")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:"]
MAX_TOKENS = 10
SPECS = [dict(r=8, alpha=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj")),
         dict(r=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj")),
         dict(r=16, alpha=16, target_modules=("o_proj", "up_proj"))]
LORA_ARGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--dtype", "float32",
             "--kv-cache-memory", "8000000")


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory):
    """Three PEFT adapters over the tiny Llama (random non-zero A and B)."""
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    root = tmp_path_factory.mktemp("adapters")
    for i, spec in enumerate(SPECS):
        save_peft_adapter(base, root / f"a{i}", seed=i + 1, **spec)
    return [root / f"a{i}" for i in range(len(SPECS))]


@pytest.fixture(scope="module")
def offline(tiny_llama_dir, adapters):
    """Greedy token-for-token references from the offline engine: base (None) and each adapter."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", enable_lora=True, max_loras=2, kv_cache_memory=1 << 22)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    loras = [None] + [LoRARequest(f"a{i}", i + 1, str(p)) for i, p in enumerate(adapters)]
    return {(lora.lora_name if lora else None): [o.outputs[0].text for o in llm.generate(PROMPTS, params,
                                                                                          lora_request=lora)]
            for lora in loras}


@pytest.fixture(scope="module")
def lora_server(tiny_llama_dir, chat_template_file, adapters, tmp_path_factory):
    """a0 as name=path, a1 in vLLM's JSON form with its own base_model_name; runtime updating on."""
    a1 = json.dumps({"name": "a1", "path": str(adapters[1]), "base_model_name": "tiny-base"})
    proc, server = start_server(tiny_llama_dir, tmp_path_factory.mktemp("logs") / "lora.log", *LORA_ARGS,
                                "--chat-template", str(chat_template_file), "--allow-runtime-lora",
                                "--lora-modules", f"a0={adapters[0]}", a1)
    yield server
    stop_server(proc)


def complete(server, model: str, stream: bool = False) -> list[str]:
    client = server.client()
    texts = []
    for prompt in PROMPTS:
        args = dict(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0,
                    extra_body={"ignore_eos": True})
        if stream:
            texts.append("".join(c.choices[0].text for c in client.completions.create(stream=True, **args)))
        else:
            r = client.completions.create(**args)
            assert r.model == model
            texts.append(r.choices[0].text)
    return texts


def post_text(server, path: str, body: dict) -> tuple[int, str]:
    """POST JSON; (status, body text): the load/unload routes answer a line of text."""
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def assert_error(status: int, text: str, expected: int, *words: str) -> dict:
    assert status == expected, text
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error


def test_model_picks_the_adapter_as_the_offline_engine_does(lora_server, offline):
    assert complete(lora_server, "test-model") == offline[None]
    assert complete(lora_server, "a0") == offline["a0"]
    assert complete(lora_server, "a1") == offline["a1"]
    assert len({tuple(texts) for texts in offline.values()}) == len(offline)  # each adapter changes the output


def test_streaming_with_an_adapter(lora_server, offline):
    assert complete(lora_server, "a0", stream=True) == offline["a0"]
    assert complete(lora_server, "a1", stream=True) == offline["a1"]


def test_chat_with_an_adapter(lora_server):
    client = lora_server.client()
    args = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=MAX_TOKENS, temperature=0.0,
                extra_body={"ignore_eos": True})
    texts = {}
    for model in ("test-model", "a0", "a1"):
        r = client.chat.completions.create(model=model, **args)
        assert r.model == model
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(model=model, stream=True, **args) if c.choices)
        assert streamed == r.choices[0].message.content
        texts[model] = streamed
    assert len(set(texts.values())) == 3


def test_base_and_adapters_mixed_in_concurrent_requests(lora_server, offline):
    client = lora_server.async_client()
    models = ["test-model", "a0", "a1"] * 2

    async def one(model: str, prompt: str) -> str:
        r = await client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0,
                                            extra_body={"ignore_eos": True})
        return r.choices[0].text

    async def run():
        return await asyncio.gather(*[one(m, p) for m in models for p in PROMPTS])

    texts = asyncio.run(run())
    expected = [offline[None if m == "test-model" else m][i] for m in models for i in range(len(PROMPTS))]
    assert texts == expected


def test_models_lists_the_adapters_with_root_and_parent(lora_server, tiny_llama_dir, adapters):
    cards = {m.id: m.model_dump() for m in lora_server.client().models.list().data}
    assert cards["test-model"]["root"] == str(tiny_llama_dir) and cards["test-model"]["parent"] is None
    assert cards["a0"]["root"] == str(adapters[0]) and cards["a0"]["parent"] == "test-model"
    assert cards["a1"]["root"] == str(adapters[1]) and cards["a1"]["parent"] == "tiny-base"
    assert {m["max_model_len"] for m in cards.values()} == {128}


def test_an_unknown_model_is_a_404_naming_it(lora_server, offline):
    client = lora_server.client()
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="a9", prompt="x", max_tokens=2)
    error = e.value.body
    assert "`a9`" in error["message"] and error["param"] == "model" and error["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="a9", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert complete(lora_server, "a0") == offline["a0"]  # nothing else harmed


def test_embeddings_refuse_an_adapter_and_ignore_the_last_steps_adapter(lora_server):
    client = lora_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="a0", input="hello")
    assert "`a0`" in e.value.body["message"] and "LoRA" in e.value.body["message"]
    before = client.embeddings.create(model="test-model", input="hello", encoding_format="float").data[0].embedding
    complete(lora_server, "a0")  # a step with an adapter sets the LoRA layers' token -> slot mapping
    after = client.embeddings.create(model="test-model", input="hello", encoding_format="float").data[0].embedding
    assert after == before


def test_load_and_unload_at_runtime(lora_server, offline, adapters):
    status, text = post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": str(adapters[2])})
    assert (status, text) == (200, "Success: LoRA adapter 'a2' added successfully."), text
    assert complete(lora_server, "a2") == offline["a2"]
    card = next(m for m in lora_server.client().models.list().data if m.id == "a2").model_dump()
    assert card["root"] == str(adapters[2]) and card["parent"] == "test-model"

    status, text = post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": str(adapters[0])})
    assert assert_error(status, text, 400, "'a2'", "already loaded")["param"] == "lora_name"

    status, text = post_text(lora_server, "/v1/unload_lora_adapter", {"lora_name": "a2"})
    assert (status, text) == (200, "Success: LoRA adapter 'a2' removed successfully."), text
    assert "a2" not in {m.id for m in lora_server.client().models.list().data}
    with pytest.raises(openai.NotFoundError):
        complete(lora_server, "a2")
    status, text = post_text(lora_server, "/v1/unload_lora_adapter", {"lora_name": "a2"})
    assert assert_error(status, text, 404, "'a2'", "not loaded")["type"] == "not_found_error"

    # loaded again under the same name, it serves again (under a new lora_int_id)
    assert post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": str(adapters[2])})[0] == 200
    assert complete(lora_server, "a2") == offline["a2"]
    assert complete(lora_server, "test-model") == offline[None]


def test_loading_a_bad_adapter_is_a_400_naming_the_problem(lora_server, tmp_path):
    missing = tmp_path / "missing"
    status, text = post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(missing)})
    assert assert_error(status, text, 400, str(missing))["param"] == "lora_path"
    (tmp_path / "empty").mkdir()
    status, text = post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "bad",
                                                                    "lora_path": str(tmp_path / "empty")})
    assert_error(status, text, 400, "adapter_config.json")
    status, text = post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "test-model",
                                                                    "lora_path": str(tmp_path)})
    assert_error(status, text, 400, "base model")
    status, text = post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "", "lora_path": ""})
    assert_error(status, text, 400, "lora_name")
    assert "bad" not in {m.id for m in lora_server.client().models.list().data}


def test_unload_errors(lora_server):
    status, text = post_text(lora_server, "/v1/unload_lora_adapter", {})
    assert_error(status, text, 400, "lora_name", "lora_int_id")
    status, text = post_text(lora_server, "/v1/unload_lora_adapter", {"lora_int_id": 999})
    assert_error(status, text, 404, "999")


def test_unloading_an_adapter_in_use_never_hangs_a_request(lora_server, adapters, tmp_path):
    """The adapter's directory goes before its unload: a request still running needs it read back
    and fails with an error naming the problem, unless it finished first."""
    doomed = tmp_path / "doomed"
    shutil.copytree(adapters[0], doomed)
    assert post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "doomed", "lora_path": str(doomed)})[0] == 200
    client = lora_server.client(timeout=60)
    stream = client.completions.create(model="doomed", prompt="x", max_tokens=100, temperature=0.0, stream=True,
                                       extra_body={"ignore_eos": True})
    first = next(iter(stream))
    shutil.rmtree(doomed)
    assert post_text(lora_server, "/v1/unload_lora_adapter", {"lora_name": "doomed"})[0] == 200
    try:
        chunks = [first, *stream]
    except openai.APIError as e:
        assert "doomed" in str(e.body), e.body
    else:
        assert chunks[-1].choices[0].finish_reason == "length"
    assert complete(lora_server, "test-model")  # the server still serves


def test_unload_by_lora_int_id(lora_server):
    """The --lora-modules adapters have lora_int_id 1, 2, ... in their order: a0 is 1."""
    status, text = post_text(lora_server, "/v1/unload_lora_adapter", {"lora_int_id": 1})
    assert (status, text) == (200, "Success: LoRA adapter 'a0' removed successfully."), text
    assert "a0" not in {m.id for m in lora_server.client().models.list().data}


def test_without_runtime_updating_the_routes_are_absent(tiny_llama_dir, adapters, tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    proc, server = start_server(tiny_llama_dir, tmp_path / "static.log", *LORA_ARGS,
                                "--lora-modules", f"a0={adapters[0]}")
    try:
        for path, body in (("/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": str(adapters[2])}),
                           ("/v1/unload_lora_adapter", {"lora_name": "a0"})):
            assert post_text(server, path, body)[0] == 404
        assert {m.id for m in server.client().models.list().data} == {"test-model", "a0"}
    finally:
        stop_server(proc)


def test_the_environment_variable_turns_runtime_updating_on(tiny_llama_dir, adapters, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    proc, server = start_server(tiny_llama_dir, tmp_path / "env.log", *LORA_ARGS)
    try:
        body = {"lora_name": "a2", "lora_path": str(adapters[2])}
        assert post_text(server, "/v1/load_lora_adapter", body)[0] == 200
        assert {m.id for m in server.client().models.list().data} == {"test-model", "a2"}
    finally:
        stop_server(proc)


@pytest.mark.parametrize("args,words", [
    (("--lora-modules", "a0={missing}"), ("a0=", "{missing}")),
    (("--lora-modules", "a0={a0}", "a0={a1}"), ("'a0'", "already loaded")),
    (("--lora-modules", "a0"), ("'a0'", "name=path")),
    (("--lora-modules", '{{"name": "a0"}}'), ("'path'",)),
], ids=["missing directory", "duplicate name", "no path", "JSON without a path"])
def test_a_bad_lora_module_fails_the_start(tiny_llama_dir, adapters, tmp_path, args, words):
    paths = dict(missing=tmp_path / "missing", a0=adapters[0], a1=adapters[1])
    args = [a.format(**paths) for a in args]
    with pytest.raises(RuntimeError) as e:
        start_server(tiny_llama_dir, tmp_path / "bad.log", *LORA_ARGS, *args)
    message = str(e.value)
    assert "exited with 2" in message
    for word in words:
        assert word.format(**paths) in message, message


@pytest.mark.parametrize("flag", [("--lora-modules", "a=/x"), ("--allow-runtime-lora",)])
def test_lora_flags_need_enable_lora(tiny_llama_dir, tmp_path, flag):
    with pytest.raises(RuntimeError, match=f"{flag[0]} needs --enable-lora"):
        start_server(tiny_llama_dir, tmp_path / "bad.log", *flag)
