"""`--lora-modules` values (vLLM's two forms) and VLLM_ALLOW_RUNTIME_LORA_UPDATING."""
import argparse

import pytest

from gdserve.entrypoints.openai.lora_modules import LoRAModulePath, parse_lora_module, runtime_lora_from_env
from gdserve.entrypoints.openai.server import add_serve_args


def test_name_equals_path():
    assert parse_lora_module("sql=/adapters/sql") == LoRAModulePath("sql", "/adapters/sql")
    assert parse_lora_module("a=/p=q") == LoRAModulePath("a", "/p=q")  # the first '=' splits


def test_json_form():
    text = '{"name": "sql", "path": "/adapters/sql", "base_model_name": "llama"}'
    assert parse_lora_module(text) == LoRAModulePath("sql", "/adapters/sql", "llama")
    assert parse_lora_module('{"name": "sql", "path": "/p"}') == LoRAModulePath("sql", "/p")


@pytest.mark.parametrize("text,words", [
    ("sql", ("'sql'", "name=path")),
    ("=/p", ("name=path",)),
    ("sql=", ("name=path",)),
    ('{"name": "sql"', ("not valid JSON",)),
    ('{"name": "sql"}', ("'path'", "non-empty string")),
    ('{"name": "", "path": "/p"}', ("'name'",)),
    ('{"name": "sql", "path": 3}', ("'path'",)),
    ('{"name": "sql", "path": "/p", "rank": 8}', ("'rank'", "base_model_name")),
    ('{"name": "sql", "path": "/p", "base_model_name": 1}', ("'base_model_name'",)),
])
def test_a_bad_value_names_the_problem(text, words):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        parse_lora_module(text)
    for word in words:
        assert word in str(e.value), str(e.value)


def test_the_flag_takes_several_values_and_repeats():
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    args = parser.parse_args(["--lora-modules", "a=/a", '{"name": "b", "path": "/b"}', "--lora-modules", "c=/c",
                              "--allow-runtime-lora"])
    assert [m.name for m in args.lora_modules] == ["a", "b", "c"]
    assert args.allow_runtime_lora
    assert parser.parse_args([]).lora_modules is None


@pytest.mark.parametrize("value,expected", [(None, False), ("", False), ("0", False), ("false", False),
                                            ("False", False), ("1", True), ("true", True), ("True", True)])
def test_runtime_updating_from_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    else:
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", value)
    assert runtime_lora_from_env() is expected


def test_a_bad_environment_value_is_an_error(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "maybe")
    with pytest.raises(ValueError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING.*'maybe'"):
        runtime_lora_from_env()
