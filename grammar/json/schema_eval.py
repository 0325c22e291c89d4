"""An exact, three-valued JSON Schema evaluator for single JSON values (json.schema uses it to
filter `enum`/`const` values through every sibling keyword, `not` and `oneOf` included).

    Evaluator(resolve).check(sub, value) -> True | False | None

True and False are certain (JSON Schema semantics, formats asserted); None means "can't tell"
(an unsupported keyword or format, a pattern this module can't decide on this string, a $ref
cycle without progress). Logic is Kleene's: `not None` is None, `False and None` is False.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from typing import Callable

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.formats import format_pattern, is_known_format
from gdserve.grammar.json.patterns import StringSpec
from gdserve.grammar.json.schema_model import (EXCLUDED_VALUES, FORBIDDEN_NAMES, TYPES_OF_NAME, Subschema,
                                               pointer_token)
from gdserve.grammar.json.values import instance_types, json_equal, json_key
from gdserve.grammar.json.strings import Limits

_UNDECIDABLE = {"unevaluatedItems", "unevaluatedProperties", "$dynamicRef", "$recursiveRef"}
_MAX_DEPTH = 64  # schema hops on one value: deeper is a $ref loop that never reaches a value


@functools.lru_cache(maxsize=512)
def _string_regex(pattern: str) -> re.Pattern | None:
    """Python regex over json.dumps(s) for the pattern's sound translation; None if the
    translation fails or had to bound a repetition (then a miss proves nothing)."""
    try:
        narrowed: list[str] = []
        rx = StringSpec.from_pattern(pattern).emit(Limits(100_000, 100_000), narrowed, "")
    except GrammarError:
        return None
    return None if narrowed or rx is None else re.compile(rx)


def pattern_test(pattern: str, s: str) -> bool | None:
    """Does s match the ECMA pattern (searched)? The translation takes the intersection of
    ECMA's and Python's character classes, so a match is certain; a miss is certain only on
    printable ASCII, where the two engines' classes agree."""
    rx = _string_regex(pattern)
    if rx is None:
        return None
    if rx.fullmatch(json.dumps(s, ensure_ascii=False)):
        return True
    return False if all(0x20 <= ord(c) < 0x7F for c in s) else None


def _all(results) -> bool | None:
    out: bool | None = True
    for r in results:
        if r is False:
            return False
        if r is None:
            out = None
    return out


def _any(results) -> bool | None:
    out: bool | None = False
    for r in results:
        if r is True:
            return True
        if r is None:
            out = None
    return out


def _not(r: bool | None) -> bool | None:
    return None if r is None else not r


def _number(v) -> Fraction | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return Fraction(Decimal(repr(v))) if isinstance(v, float) else Fraction(v)


class Evaluator:
    def __init__(self, resolve: Callable[[object, Subschema], Subschema]):
        self.resolve = resolve  # Normalizer._resolve: ($ref, sub) -> target sub; GrammarError on a cycle
        self._key_sets: dict[int, tuple[list, set]] = {}  # id(an enum list) -> (it, its json_keys)

    def _keys(self, values: list) -> set:
        """The json_keys of a schema's enum list (kept with it, so the id stays its own)."""
        hit = self._key_sets.get(id(values))
        if hit is None or hit[0] is not values:
            hit = self._key_sets[id(values)] = (values, set(map(json_key, values)))
        return hit[1]

    def decide(self, subs: list[Subschema], value) -> bool | None:
        """Does value satisfy every sub (a conjunction)? A sub's `skip` keywords are left out:
        their expansion is elsewhere in the conjunction."""
        subs = [replace(s, schema={k: v for k, v in s.schema.items() if k not in s.skip})
                if s.skip and isinstance(s.schema, dict) else s for s in subs]
        try:
            return _all(self.check(s, value) for s in subs)
        except (TypeError, ValueError, AttributeError, RecursionError):  # malformed keyword values
            return None

    def check(self, sub: Subschema, value, depth: int = 0) -> bool | None:
        s = sub.schema
        if s is True or s is False:
            return s
        if not isinstance(s, dict) or depth > _MAX_DEPTH:
            return None
        if any(k in s for k in _UNDECIDABLE):
            return None
        checks = [self._ref, self._logic, self._type_enum, self._numeric, self._string,
                  self._object, self._array]
        return _all(c(sub, s, value, depth) for c in checks)

    def _child(self, schema, ptr: str, value) -> bool | None:
        """A subschema applied to a member of the value: progress made, $ref history reset."""
        return self.check(Subschema(schema, ptr, frozenset()), value)

    def _same(self, sub: Subschema, schema, ptr: str, value, depth: int) -> bool | None:
        return self.check(Subschema(schema, ptr, sub.refs), value, depth + 1)

    def _ref(self, sub: Subschema, s: dict, value, depth: int) -> bool | None:
        if "$ref" not in s:
            return True
        try:
            target = self.resolve(s["$ref"], sub)
        except GrammarError:
            return None
        return self.check(target, value, depth + 1)

    def _logic(self, sub: Subschema, s: dict, v, depth: int) -> bool | None:
        p = sub.ptr
        out = []
        for kw in ("allOf", "anyOf", "oneOf"):
            if kw not in s:
                continue
            if not isinstance(s[kw], list):
                return None
            rs = [self._same(sub, b, f"{p}/{kw}/{i}", v, depth) for i, b in enumerate(s[kw])]
            if kw == "allOf":
                out.append(_all(rs))
            elif kw == "anyOf":
                out.append(_any(rs))
            else:
                out.append(None if None in rs else rs.count(True) == 1)
        if "not" in s:
            out.append(_not(self._same(sub, s["not"], f"{p}/not", v, depth)))
        if "if" in s and ("then" in s or "else" in s):
            cond = self._same(sub, s["if"], f"{p}/if", v, depth)
            then = self._same(sub, s.get("then", True), f"{p}/then", v, depth)
            other = self._same(sub, s.get("else", True), f"{p}/else", v, depth)
            out.append(then if cond is True else other if cond is False else
                       (True if then is True and other is True else None))
        return _all(out)

    def _type_enum(self, sub: Subschema, s: dict, v, depth: int) -> bool | None:
        out = []
        if "type" in s:
            names = [s["type"]] if isinstance(s["type"], str) else s["type"]
            if not isinstance(names, list) or any(x not in TYPES_OF_NAME for x in names):
                return None
            allowed = set().union(*(TYPES_OF_NAME[x] for x in names)) if names else set()
            out.append(bool(instance_types(v) & allowed))
        if "enum" in s:
            if not isinstance(s["enum"], list):
                return None
            out.append(json_key(v) in self._keys(s["enum"]))
        if "const" in s:
            out.append(json_equal(v, s["const"]))
        if EXCLUDED_VALUES in s:
            out.append(json_key(v) not in self._keys(s[EXCLUDED_VALUES]))
        return _all(out)

    def _numeric(self, sub: Subschema, s: dict, v, depth: int) -> bool | None:
        x = _number(v)
        if x is None:
            return True
        out = []
        for kw, ok in (("minimum", lambda b: x >= b), ("maximum", lambda b: x <= b),
                       ("exclusiveMinimum", lambda b: x > b), ("exclusiveMaximum", lambda b: x < b)):
            b = s.get(kw)
            if isinstance(b, bool):  # draft 4: modifies minimum/maximum
                continue
            if b is not None:
                nb = _number(b)
                if nb is None:
                    return None
                out.append(ok(nb))
        for kw, ex, ok in (("minimum", "exclusiveMinimum", lambda b: x > b),
                           ("maximum", "exclusiveMaximum", lambda b: x < b)):
            if s.get(ex) is True and kw in s:
                nb = _number(s[kw])
                if nb is None:
                    return None
                out.append(ok(nb))
        if "multipleOf" in s:
            m = _number(s["multipleOf"])
            if m is None or m <= 0:
                return None
            out.append((x / m).denominator == 1)
        return _all(out)

    def _string(self, sub: Subschema, s: dict, v, depth: int) -> bool | None:
        if not isinstance(v, str):
            return True
        out = []
        if "minLength" in s:
            out.append(len(v) >= s["minLength"])
        if "maxLength" in s:
            out.append(len(v) <= s["maxLength"])
        if "pattern" in s:
            out.append(pattern_test(s["pattern"], v) if isinstance(s["pattern"], str) else None)
        if "format" in s:
            out.append(_format_test(s["format"], v))
        return _all(out)

    def _object(self, sub: Subschema, s: dict, v, depth: int) -> bool | None:
        if not isinstance(v, dict):
            return True
        p = sub.ptr
        out = []
        props = s.get("properties", {})
        pats = s.get("patternProperties", {})
        if not isinstance(props, dict) or not isinstance(pats, dict):
            return None
        if "required" in s:
            out.append(all(r in v for r in s["required"]))
        if FORBIDDEN_NAMES in s:
            out.append(not any(r in v for r in s[FORBIDDEN_NAMES]))
        if "minProperties" in s:
            out.append(len(v) >= s["minProperties"])
        if "maxProperties" in s:
            out.append(len(v) <= s["maxProperties"])
        for k, x in v.items():
            matched = [q for q in pats if pattern_test(q, k) is not False]
            if any(pattern_test(q, k) is None for q in matched):
                return None
            if k in props:
                out.append(self._child(props[k], f"{p}/properties/{pointer_token(k)}", x))
            for q in matched:
                out.append(self._child(pats[q], f"{p}/patternProperties/{pointer_token(q)}", x))
            if k not in props and not matched and "additionalProperties" in s:
                out.append(self._child(s["additionalProperties"], f"{p}/additionalProperties", x))
            if "propertyNames" in s:
                out.append(self._child(s["propertyNames"], f"{p}/propertyNames", k))
        out.append(self._dependencies(sub, s, v, depth))
        return _all(out)

    def _dependencies(self, sub: Subschema, s: dict, v: dict, depth: int) -> bool | None:
        p = sub.ptr
        out = []
        for kw in ("dependentRequired", "dependentSchemas", "dependencies"):
            deps = s.get(kw, {})
            if not isinstance(deps, dict):
                return None
            for k, d in deps.items():
                if k not in v:
                    continue
                if isinstance(d, list):
                    out.append(all(r in v for r in d))
                else:
                    out.append(self._same(sub, d, f"{p}/{kw}/{pointer_token(k)}", v, depth))
        return _all(out)

    def _array(self, sub: Subschema, s: dict, v, depth: int) -> bool | None:
        if not isinstance(v, list):
            return True
        p = sub.ptr
        out = []
        items = s.get("items")
        if isinstance(items, list):  # draft 2019 and older: tuple form
            prefix, rest, rest_kw = items, s.get("additionalItems"), "additionalItems"
        else:
            prefix, rest, rest_kw = s.get("prefixItems", []), items, "items"
        if not isinstance(prefix, list):
            return None
        pre_kw = "items" if isinstance(items, list) else "prefixItems"
        for i, x in enumerate(v):
            if i < len(prefix):
                out.append(self._child(prefix[i], f"{p}/{pre_kw}/{i}", x))
            elif rest is not None:
                out.append(self._child(rest, f"{p}/{rest_kw}", x))
        if "minItems" in s:
            out.append(len(v) >= s["minItems"])
        if "maxItems" in s:
            out.append(len(v) <= s["maxItems"])
        if s.get("uniqueItems") is True:
            out.append(len(set(map(json_key, v))) == len(v))
        if "contains" in s:
            hits = [self._child(s["contains"], f"{p}/contains", x) for x in v]
            if None in hits:
                return None
            n = hits.count(True)
            lo = s.get("minContains", 1)
            hi = s.get("maxContains")
            out.append(n >= lo and (hi is None or n <= hi))
        return _all(out)


def _format_test(fmt, s: str) -> bool | None:
    """Known formats are asserted (our patterns accept a subset: a miss proves nothing);
    formats outside the known vocabularies are annotations."""
    if not isinstance(fmt, str):
        return None
    if not is_known_format(fmt):
        return True
    pat = format_pattern(fmt)
    if pat is None:
        return None
    return True if pattern_test(pat, s) else None
