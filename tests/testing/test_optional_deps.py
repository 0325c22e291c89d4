"""jsonschema and openai are optional: importing the plugin needs neither; using them says what to install."""
import subprocess
import sys

import pytest

from gdserve.testing import assert_conforms, start_server


def test_plugin_imports_without_jsonschema_openai_or_the_engine():
    code = ("import sys, gdserve.testing.plugin; "
            "print(sorted(m for m in ('jsonschema', 'openai', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_assert_conforms_without_jsonschema(monkeypatch):
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    with pytest.raises(ImportError, match="needs jsonschema: pip install jsonschema"):
        assert_conforms("{}", {"type": "object"})


def test_server_without_openai_fails_before_starting(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(ImportError, match="needs the openai package: pip install openai"):
        start_server(None, [], tmp_path / "server.log")
    assert not (tmp_path / "server.log").exists()
