from pathlib import Path

import pytest

# Bytes in, bytes out: the tiny model's context is 128 tokens, so the prompt stays short.
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] + '\\n' }}{% endfor %}"


@pytest.fixture(scope="session")
def tiny_args(tiny_llama_dir, tmp_path_factory) -> list[str]:
    """Command-line options that point the plugin's fixtures at the tiny random-weight Llama."""
    template = tmp_path_factory.mktemp("template") / "plain.jinja"
    template.write_text(PLAIN_TEMPLATE)
    return ["--gdserve-model", str(tiny_llama_dir),
            f"--gdserve-arg=--chat-template {template} --kv-cache-memory 8000000",
            "--gdserve-arg=--grammar-compile-workers 1", "-p", "no:cacheprovider"]


@pytest.fixture
def schema_dir(pytester) -> Path:
    pytester.makefile(".json", **{"schemas/point": '{"type": "object", "required": ["x"]}',
                                  "schemas/flag": '{"type": "boolean"}'})
    return pytester.path / "schemas"
