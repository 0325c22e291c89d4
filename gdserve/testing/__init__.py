"""Test helpers for structured outputs: `assert_conforms`, a `gdserve serve` process handle, and a
pytest plugin (gdserve.testing.plugin, registered through the `pytest11` entry point) with the
`gdserve_server` and `gdserve_llm` fixtures and the `schema` marker.

Nothing here imports jsonschema, openai or the engine until it is used."""
from gdserve.testing.conforms import assert_conforms
from gdserve.testing.schemas import load_schemas
from gdserve.testing.server import GdserveServer, start_server

__all__ = ["assert_conforms", "load_schemas", "GdserveServer", "start_server"]
