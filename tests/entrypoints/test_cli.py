"""The CLI where only the engine's dependencies are installed (a GPU image with torch and
transformers alone): `gdserve bench ...` and the help of every command still load."""
import subprocess
import sys

import pytest

# Runs the CLI with the server's (and the GGUF loader's) packages made unimportable.
BLOCKED = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"fastapi", "starlette", "uvicorn", "pydantic", "prometheus_client", "gguf"}:
            raise ImportError(f"{name} is not installed")
sys.meta_path.insert(0, Blocker())
from gdserve.entrypoints.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("command", [["bench", "throughput", "--help"], ["bench", "maskbench", "--help"],
                                     ["bench", "grammar", "--help"], ["bench", "serve", "--help"],
                                     ["serve", "--help"], ["generate", "--help"]])
def test_commands_load_without_the_server_dependencies(command):
    done = subprocess.run([sys.executable, "-c", BLOCKED, *command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: gdserve" in done.stdout


@pytest.mark.parametrize("flag,value,choice", [("--kv-cache-dtype", "int8", "fp8_e5m2"),
                                               ("--quantization", "int4", "gguf")])
def test_a_bad_choice_is_refused_naming_the_choices(flag, value, choice):
    done = subprocess.run([sys.executable, "-m", "gdserve.entrypoints.cli", "serve", flag, value],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert flag in done.stderr and choice in done.stderr



@pytest.mark.parametrize("flags,message", [
    (["--replicas", "2"], "--replicas needs --ray (data-parallel replicas run on Ray Serve)"),
    (["--ray-address", "auto"], "--ray-address needs --ray (data-parallel replicas run on Ray Serve)"),
    (["--ray", "--replicas", "0"], "--replicas must be >= 1, got 0")])
def test_replica_flags_that_do_not_fit_are_refused_in_one_line(flags, message):
    done = subprocess.run([sys.executable, "-m", "gdserve.entrypoints.cli", "serve", *flags],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"gdserve: error: {message}\n"
