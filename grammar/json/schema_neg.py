"""Negation for json.schema_norm: `not S` (and the rewrites of oneOf, if/then/else and
dependencies that need it) as alternatives of positive schemas, exact or not at all.

    negate(sub, resolve, keep) -> [[Subschema, ...], ...] | None

The result is in disjunctive form: the instance satisfies `not S` iff it satisfies every sub of
some alternative ([] = unsatisfiable, [[]] = anything). None: S has a keyword whose negation has no
positive form here (pattern, format, properties, items, ...). Two private keywords carry what JSON
Schema can't say positively: FORBIDDEN_NAMES (these property names are absent) and EXCLUDED_VALUES
(the value is none of these); `keep` holds every synthesized schema alive (the compiler memoizes on schema ids).
"""

from __future__ import annotations

from itertools import product
from typing import Callable

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.formats import is_known_format
from gdserve.grammar.json.schema_model import (EXCLUDED_VALUES, FORBIDDEN_NAMES, TYPES_OF_NAME, Subschema,
                                               pointer_token)

MAX_ALTERNATIVES = 64

_ALL_TYPES = ("null", "boolean", "object", "array", "string", "number")
_ASSERTIONS = {"type", "enum", "const", "required", "not", "$ref", "allOf", "anyOf", "oneOf", "if",
               "pattern", "format", "multipleOf", "properties", "patternProperties",
               "additionalProperties", "propertyNames", "dependencies", "dependentRequired",
               "dependentSchemas", "items", "prefixItems", "additionalItems", "contains",
               "uniqueItems", "unevaluatedItems", "unevaluatedProperties", "$dynamicRef",
               "$recursiveRef", "minLength", "maxLength", "minItems", "maxItems", "minProperties",
               "maxProperties", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
               FORBIDDEN_NAMES, EXCLUDED_VALUES}
# keyword -> (type the keyword applies to, keyword of the complement, bound shift)
_BOUNDS = {
    "minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1), "maxProperties": ("object", "minProperties", 1),
    "minimum": ("number", "exclusiveMaximum", 0), "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMinimum": ("number", "maximum", 0), "exclusiveMaximum": ("number", "minimum", 0),
}


def _other_types(t: str) -> list[str]:
    return [x for x in _ALL_TYPES if x != t]


class Negator:
    def __init__(self, resolve: Callable[[object, Subschema], Subschema], keep: list):
        self.resolve = resolve
        self.keep = keep

    def _new(self, schema: dict, ptr: str, refs: frozenset) -> list[Subschema]:
        self.keep.append(schema)
        return [Subschema(schema, ptr, refs)]

    def negate(self, sub: Subschema, partial: bool = False) -> list[list[Subschema]] | None:
        """partial: leave out the alternatives of keywords without a positive negation (a subset of
        `not S`, sound where it only narrows); self.dropped tells whether any was left out."""
        if not partial:
            return self._negate(sub, False)
        self.dropped = False
        alts = self._negate(sub, True)
        return None if alts is None or (self.dropped and not alts) else alts

    def _negate(self, sub: Subschema, partial: bool) -> list[list[Subschema]] | None:
        s = sub.schema
        if s is True:
            return []
        if s is False:
            return [[]]
        if not isinstance(s, dict):
            return None
        alts: list[list[Subschema]] = []
        for kw, v in s.items():
            if kw not in _ASSERTIONS or kw == "if" and "then" not in s and "else" not in s:
                continue  # annotations and unknown keywords assert nothing
            if kw == "format" and not (isinstance(v, str) and is_known_format(v)):
                continue
            part = self._keyword(sub, kw, v, partial)
            if part is None and partial:
                self.dropped = True
                continue
            if part is None:
                return None
            alts += part
            if len(alts) > MAX_ALTERNATIVES:
                return None
        return alts

    def _keyword(self, sub: Subschema, kw: str, v, partial: bool) -> list[list[Subschema]] | None:
        """not {kw: v} (with v's siblings ignored: not (a and b) = not a or not b)."""
        p, refs = f"{sub.ptr}/not", sub.refs
        if kw == "type":
            names = [v] if isinstance(v, str) else v
            if not isinstance(names, list) or any(x not in TYPES_OF_NAME for x in names):
                return None
            covered = set().union(*(TYPES_OF_NAME[x] for x in names)) if names else set()
            if "integer" in covered and "fraction" not in covered:
                return None  # "a number that is not an integer" has no type of its own
            rest = [t for t in _ALL_TYPES if not (set(TYPES_OF_NAME[t]) & covered)]
            return [self._new({"type": rest}, p, refs)] if rest else []
        if kw in ("enum", "const"):
            vals = [v] if kw == "const" else v
            return [self._new({EXCLUDED_VALUES: list(vals)}, p, refs)] if isinstance(vals, list) else None
        if kw == "required":
            if not isinstance(v, list):
                return None
            return [self._new({FORBIDDEN_NAMES: [r]}, p, refs) for r in v]
        if kw == EXCLUDED_VALUES:
            return [self._new({"enum": list(v)}, p, refs)]
        if kw == FORBIDDEN_NAMES:
            return [self._new({"type": "object", "required": [r]}, p, refs) for r in v]
        if kw in _BOUNDS:
            return self._bound(kw, v, p, refs)
        if kw == "not":
            return [[Subschema(v, p + "/not", refs)]]
        if kw == "$ref":
            try:
                return self._negate(self.resolve(v, sub), partial)
            except GrammarError:
                return None
        if kw == "properties" and isinstance(v, dict):
            return self._properties(sub, v, partial)
        if kw == "allOf" and isinstance(v, list):
            out: list[list[Subschema]] = []
            for i, b in enumerate(v):
                n = self._negate(Subschema(b, f"{sub.ptr}/allOf/{i}", refs), partial)
                if n is None:
                    return None
                out += n
            return out
        if kw == "anyOf" and isinstance(v, list):
            parts = [self._negate(Subschema(b, f"{sub.ptr}/anyOf/{i}", refs), partial) for i, b in enumerate(v)]
            if any(x is None for x in parts):
                return None
            total = 1
            for x in parts:
                total *= len(x)
            if total > MAX_ALTERNATIVES:
                return None
            return [[s for alt in combo for s in alt] for combo in product(*parts)]
        return None

    def _properties(self, sub: Subschema, props: dict, partial: bool) -> list[list[Subschema]] | None:
        """not properties = an object with some declared property whose value fails its schema;
        only where that failure has a positive form free of $ref (it moves into a new schema)."""
        out: list[list[Subschema]] = []
        for name, ps in props.items():
            neg = self._negate(Subschema(ps, f"{sub.ptr}/properties/{pointer_token(name)}", sub.refs), partial)
            if neg is None or any(has_ref(x.schema) for alt in neg for x in alt):
                if not partial:
                    return None
                self.dropped = True
                continue
            for alt in neg:
                inner = [x.schema for x in alt]
                value = True if not inner else inner[0] if len(inner) == 1 else {"allOf": inner}
                out += [self._new({"type": "object", "required": [name], "properties": {name: value}},
                                  f"{sub.ptr}/not", sub.refs)]
        return out

    def _bound(self, kw: str, v, p: str, refs: frozenset) -> list[list[Subschema]] | None:
        t, other, shift = _BOUNDS[kw]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None  # draft-4 boolean exclusive bounds modify a sibling
        alts = [self._new({"type": _other_types(t)}, p, refs)]
        bound = v + shift
        if shift < 0 and bound < 0:
            return alts
        return alts + [self._new({"type": t, other: bound}, p, refs)]


def has_ref(schema) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(has_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(has_ref(v) for v in schema)
    return False
