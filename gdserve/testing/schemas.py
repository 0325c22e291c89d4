"""The schemas a `@pytest.mark.schema(...)` source names: a directory's .json files, one file, or a
pydantic model class."""
import json
from pathlib import Path
from typing import Any


def _read(path: Path) -> Any:
    try:
        schema = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"schema file {str(path)!r} is not JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"schema file {str(path)!r} holds a {type(schema).__name__}, not a JSON Schema")
    return schema


def load_schemas(source: Any, base_dir: Path | None = None) -> list[tuple[str, Any]]:
    """(id, schema) pairs: for a directory, each *.json file in it by name (ids are file names); for a
    file, that file; for a pydantic model class, the class itself (id: its name). A relative path is
    read from `base_dir` (the test file's directory in the marker)."""
    if isinstance(source, type) and hasattr(source, "model_json_schema"):
        return [(source.__name__, source)]
    if not isinstance(source, (str, Path)):
        raise TypeError(f"a schema source is a path (str or Path) or a pydantic model class, "
                        f"not {type(source).__name__}")
    path = Path(source)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise ValueError(f"schema directory {str(path)!r} has no .json files")
        return [(f.name, _read(f)) for f in files]
    if path.is_file():
        return [(path.name, _read(path))]
    raise ValueError(f"schema path {str(path)!r} does not exist")
