"""JSON values as JSON Schema sees them: their instance types, and equality (1 and 1.0 one number,
true not 1) as a hashable key."""

from __future__ import annotations

from gdserve.grammar.errors import GrammarError


def instance_types(v) -> set:
    """The instance types of a JSON value (an integral float is an "integer", else a "fraction")."""
    if v is None:
        return {"null"}
    if isinstance(v, bool):
        return {"boolean"}
    if isinstance(v, int):
        return {"integer"}
    if isinstance(v, float):
        return {"integer"} if v.is_integer() else {"fraction"}
    if isinstance(v, str):
        return {"string"}
    if isinstance(v, list):
        return {"array"}
    if isinstance(v, dict):
        return {"object"}
    raise GrammarError(f"not a JSON value: {v!r}")


def json_equal(a, b) -> bool:
    return json_key(a) == json_key(b)


def json_key(v) -> tuple:
    """A hashable key, equal exactly for equal JSON values (1 and 1.0 one number, true not 1):
    membership among thousands of enum values in a set, not pairwise."""
    if isinstance(v, bool):
        return (0, v)
    if isinstance(v, (int, float)):
        return (1, v)
    if isinstance(v, list):
        return (2, tuple(map(json_key, v)))
    if isinstance(v, dict):
        return (3, frozenset((k, json_key(x)) for k, x in v.items()))
    return (4, type(v).__name__, v)


def unique_json(values: list) -> list:
    """values without repeats (json_equal), first occurrences in order."""
    out: dict = {}
    for v in values:
        out.setdefault(json_key(v), v)
    return list(out.values())
