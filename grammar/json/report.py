"""The enforcement report of a compiled JSON Schema: every assertion keyword, by JSON pointer,
as enforced exactly, approximated (a bound narrowed, a nesting depth capped, oneOf compiled as
anyOf) or ignored: in lenient mode what could not be enforced; in both modes a format outside the
JSON Schema vocabularies, an annotation (strict mode refuses every other keyword it cannot enforce)."""
from __future__ import annotations

# Keywords that constrain instances (annotations such as title or examples are not listed).
ASSERTIONS = frozenset((
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "dependencies",
    "properties", "patternProperties", "additionalProperties", "propertyNames", "items", "prefixItems",
    "additionalItems", "contains", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
    "not", "if", "then", "else", "dependentSchemas", "$ref", "$dynamicRef"))
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_ONE = ("not", "if", "then", "else", "additionalProperties", "propertyNames", "contains", "items",
               "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_APPROXIMATIONS = ("any value at", "oneOf at")  # relaxed entries that narrow rather than drop


def enforcement_report(schema, relaxed: list[str], narrowed: list[str]) -> dict[str, list[str]]:
    """{"exact": ["keyword at /pointer", ...], "approximated": [...], "ignored": [...]}: the
    approximated and ignored entries say what was done; exact lists every other assertion."""
    approximated = list(narrowed) + [r for r in relaxed if r.startswith(_APPROXIMATIONS)]
    ignored = [r for r in relaxed if not r.startswith(_APPROXIMATIONS)]
    exact = [entry for entry in _keywords(schema, "")
             if not any(_names(message, entry) for message in ignored + approximated)]
    return {"exact": exact, "approximated": approximated, "ignored": ignored}


def _names(message: str, entry: str) -> bool:
    """Whether a relaxed or narrowed message is about this "keyword at /pointer" entry. Relaxed
    messages start "<what> at <pointer>", where <what> is the keyword, "format '<name>'" or
    "minLength/maxLength"; narrowed ones start "at <pointer>:" and name the keyword after."""
    keyword, _, pointer = entry.partition(" at ")
    if message.startswith(f"at {pointer}:"):
        return keyword in message
    what, sep, rest = message.partition(f" at {pointer}")
    if not sep or rest[:1] not in ("", " ", ":"):
        return False
    return keyword == what or what.startswith(f"{keyword} '") or keyword in what.split("/")


def _keywords(schema, ptr: str) -> list[str]:
    if not isinstance(schema, dict):
        return []
    out = [f"{kw} at {ptr or '/'}" for kw in schema if kw in ASSERTIONS]
    for kw, value in schema.items():
        if kw in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                out += _keywords(sub, f"{ptr}/{kw}/{_escape(name)}")
        elif kw in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                out += _keywords(sub, f"{ptr}/{kw}/{i}")
        elif kw in _SCHEMA_ONE:
            out += _keywords(value, f"{ptr}/{kw}")
    return out


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
