"""assert_conforms: parse an output and validate it against a JSON Schema or a pydantic model."""
import json
import os
from pathlib import Path
from typing import Any

SHOWN_CHARS = 200  # of the offending text in a failure message


def _require_jsonschema():
    try:
        import jsonschema
    except ImportError:
        raise ImportError("assert_conforms with a JSON Schema needs jsonschema: pip install jsonschema") from None
    return jsonschema


def _is_model_class(schema: Any) -> bool:
    return isinstance(schema, type) and hasattr(schema, "model_validate_json")


def _parse(output: Any) -> Any:
    if isinstance(output, bytes):
        output = output.decode("utf-8", errors="replace")
    if not isinstance(output, str):
        return output
    try:
        return json.loads(output)
    except json.JSONDecodeError as e:
        raise AssertionError(f"output is not JSON: {e.msg} at line {e.lineno} column {e.colno}\n"
                             f"  offending text: {_clip(output[e.pos:])!r}\n"
                             f"  output: {_clip(output)!r}") from None


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def json_pointer(path) -> str:
    """RFC 6901: '' is the whole document, '/a/0/b~1c' is a['0']['b/c']."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _fail(pointer: str, message: str, offending: Any, count: int) -> AssertionError:
    where = pointer or "'' (the whole output)"
    more = f"\n  ({count} errors in all)" if count > 1 else ""
    return AssertionError(f"output does not conform at {where}: {message}\n"
                          f"  offending text: {_clip(json.dumps(offending, default=str))}{more}")


def _load_schema(schema: Any) -> Any:
    if isinstance(schema, (str, os.PathLike)):
        path = Path(schema)
        if not path.is_file():
            raise ValueError(f"schema file {str(path)!r} does not exist")
        return json.loads(path.read_text())
    if not isinstance(schema, (dict, bool)):
        raise TypeError(f"schema must be a JSON Schema (dict, bool or file path) or a pydantic model class, "
                        f"not {type(schema).__name__}")
    return schema


def _check_schema(instance: Any, schema: Any) -> Any:
    jsonschema = _require_jsonschema()
    cls = jsonschema.Draft202012Validator
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ValueError(f"invalid JSON Schema at {json_pointer(e.absolute_path) or '(root)'}: {e.message}") \
            from None
    errors = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(instance))
    if errors:
        # the first error in document order; best_match looks inside an anyOf/oneOf for its likeliest branch
        first = jsonschema.exceptions.best_match(errors[:1])
        raise _fail(json_pointer(first.absolute_path), first.message, first.instance, len(errors))
    return instance


def _check_model(output: Any, instance: Any, model: type) -> Any:
    import pydantic
    try:
        if isinstance(output, (str, bytes)):  # JSON-mode rules, as the model would read the raw text
            return model.model_validate_json(output)
        return model.model_validate(instance)
    except pydantic.ValidationError as e:
        errors = e.errors()
        first = errors[0]
        raise _fail(json_pointer(first["loc"]), first["msg"], first.get("input"), len(errors)) from None


def assert_conforms(output: Any, schema_or_model: Any) -> Any:
    """Assert `output` (JSON text as str/bytes, or an already parsed value) conforms to a JSON Schema
    (a dict, a bool, or a path to a .json file; Draft 2020-12 with format checking) or to a pydantic
    model class. Returns the parsed value (the model instance for a model). On failure raises
    AssertionError naming the JSON pointer of the first error and the offending text."""
    instance = _parse(output)
    if _is_model_class(schema_or_model):
        return _check_model(output, instance, schema_or_model)
    return _check_schema(instance, _load_schema(schema_or_model))
