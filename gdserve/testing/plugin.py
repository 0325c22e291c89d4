"""The gdserve pytest plugin: `gdserve_server`, `gdserve_llm` and `@pytest.mark.schema(...)`.

    pytest --gdserve-model PATH_OR_ALIAS --gdserve-arg="--max-model-len 2048" --gdserve-arg=--enforce-eager
"""
import shlex
from pathlib import Path

import pytest

from gdserve.testing.schemas import load_schemas
from gdserve.testing.server import start_server


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gdserve", "gdserve fixtures")
    group.addoption("--gdserve-model", default=None,
                    help="model (path or alias) of gdserve_server and gdserve_llm (default: gdserve's default)")
    group.addoption("--gdserve-arg", action="append", default=[], metavar="ARGS",
                    help="flags for `gdserve serve` (split like a shell line; repeatable), e.g. "
                         "--gdserve-arg='--max-model-len 2048'; engine flags also configure gdserve_llm")
    group.addoption("--gdserve-timeout", type=float, default=300.0,
                    help="seconds gdserve_server waits for /health (default: 300)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "schema(*sources): run the test once per JSON Schema of each source (a "
                                       "directory of .json files, one file, or a pydantic model class), passed "
                                       "as the `schema` argument")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("schema")
    if marker is None:
        return
    if "schema" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.schema needs a `schema` argument")
    if not marker.args:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.schema needs a path or a model")
    base_dir = Path(metafunc.definition.path).parent
    pairs = [pair for source in marker.args for pair in load_schemas(source, base_dir)]
    metafunc.parametrize("schema", [schema for _, schema in pairs], ids=[name for name, _ in pairs])


def server_args(config: pytest.Config) -> list[str]:
    return [arg for value in config.getoption("gdserve_arg") for arg in shlex.split(value)]


@pytest.fixture(scope="session")
def gdserve_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A `gdserve serve` process on a free port: `.base_url`, `.model` (the served id) and `.client`
    (an openai.OpenAI). Stopped with SIGTERM (then SIGKILL) after the session."""
    config = request.config
    log_path = tmp_path_factory.mktemp("gdserve") / "server.log"
    try:
        server = start_server(config.getoption("gdserve_model"), server_args(config), log_path,
                              config.getoption("gdserve_timeout"))
    except (RuntimeError, ImportError) as e:
        pytest.fail(str(e), pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gdserve_llm(request: pytest.FixtureRequest):
    """The offline engine, `gdserve.LLM`, on --gdserve-model with the engine flags of --gdserve-arg."""
    from gdserve.testing.llm import make_llm
    config = request.config
    llm = make_llm(config.getoption("gdserve_model"), server_args(config))
    yield llm
    llm.engine.close()
