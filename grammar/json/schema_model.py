"""The schema model that json.schema_norm builds and json.schema, json.schema_neg and
json.schema_eval read.

A schema position is a Conjunction: Subschemas (schema, JSON pointer, $refs on the path) that an
instance must all satisfy. Normalizing one gives Alternatives (an anyOf/oneOf distributed over its
siblings) or a MergedSchema (every keyword of the conjunction merged into one set of constraints,
its child positions again conjunctions).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gdserve.grammar.json.numbers import Bound

# Instance types: JSON Schema's, with "number" split into "integer" and "fraction"
INSTANCE_TYPES = ("null", "boolean", "object", "array", "string", "integer", "fraction")
TYPES_OF_NAME = {"null": {"null"}, "boolean": {"boolean"}, "object": {"object"}, "array": {"array"},
                 "string": {"string"}, "integer": {"integer"}, "number": {"integer", "fraction"}}

# Private keywords of synthesized schemas (json.schema_neg), never in a user's schema:
FORBIDDEN_NAMES = "\x00forbid"  # [names]: an object has none of them
EXCLUDED_VALUES = "\x00notIn"  # [values]: the instance equals none of them


def show_pointer(ptr: str) -> str:
    """A JSON pointer as messages write it (the root as "/")."""
    return ptr or "/"


def pointer_token(name: str) -> str:
    """A property name escaped as one JSON pointer token (RFC 6901: ~ as ~0, / as ~1)."""
    return name.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class Subschema:
    schema: Any
    ptr: str
    refs: frozenset  # $ref targets expanded on the way here (cycle detection)
    skip: frozenset = frozenset()  # keywords already expanded (not to apply twice)


Conjunction = list[Subschema]


@dataclass
class Alternatives:
    kind: str  # "anyOf" | "oneOf"
    ptr: str
    conjs: list[Conjunction]


@dataclass
class MergedSchema:
    ptr: str
    types: set | None = None
    enum: list | None = None
    lo: Bound | None = None
    hi: Bound | None = None
    lo_src: tuple = ()
    hi_src: tuple = ()
    min_len: int = 0
    max_len: int | None = None
    patterns: list = field(default_factory=list)  # (pattern, ptr)
    formats: list = field(default_factory=list)
    props: dict = field(default_factory=dict)  # name -> conj
    required: list = field(default_factory=list)
    additional: list | None = None
    prop_names: list | None = None
    pattern_props: list = field(default_factory=list)  # (pattern, ptr, conj)
    min_props: int = 0
    max_props: int | None = None
    min_props_ptr: str = ""
    max_props_ptr: str = ""
    prefix: list = field(default_factory=list)
    items: list | None = None
    min_items: int = 0
    max_items: int | None = None
    unique: str | None = None  # pointer of uniqueItems: true
    contains: list = field(default_factory=list)  # (contains sub, minContains, maxContains or None)
    multiple_of: list = field(default_factory=list)  # (Decimal step > 0, ptr)
    forbidden: set = field(default_factory=set)  # property names that must be absent
    # anyOf/oneOf branches of this object that differ only in required / absent declared names:
    # (kind, ((required, forbidden), ...)), decided by the keys read (json.schema._interleaved)
    presence: tuple | None = None
    excluded: list = field(default_factory=list)  # values the instance must not equal
    from_allof: bool = False

    def unconstrained(self) -> bool:
        return self == MergedSchema(self.ptr, from_allof=self.from_allof)

    def only_types(self) -> bool:
        return replace(self, types=None, enum=None) == MergedSchema(self.ptr, from_allof=self.from_allof)
