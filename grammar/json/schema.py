"""JSON Schema → regex, exact where it can be and loud where it can't.

    regex, relaxed = schema_to_regex(schema, whitespace_pattern=None, lenient=False)
    info = compile_json_schema(schema, ...)      # .regex, .relaxed, .narrowed, .unique_items
    rules = compile_json_schema_rules(schema, ...)  # the grammar path's form (json.schema_cfg)

The regex matches one JSON text (no leading/trailing whitespace) and is written in the dialect that
both Python `re` and the Rust `regex` crate (outlines-core) read: no lookaround, backreferences,
named groups or `\\d`/`\\w`/`\\s`; non-ASCII written as `\\uXXXX`/`\\UXXXXXXXX`; group nesting
kept shallow.

Soundness first: every text the regex accepts parses (Python `json`) to an instance the schema
accepts (`jsonschema`, formats checked). Where the regex is stricter than the schema (a bound
lowered to a cap, objects closed to their declared keys, declared keys in schema order) it says so
in `narrowed`; what lenient mode drops, or approximates, is in `relaxed`. A keyword that cannot be
enforced exactly raises GrammarError naming it and its JSON pointer (strict mode). Recursive
schemas raise RecursiveSchemaError and regexes past MAX_REGEX_CHARS / MAX_EXPANDED_SIZE
RegexTooLargeError; compile_json_schema_rules compiles both for the grammar path, where every
subschema whose regex is RULE_MIN_CHARS long or more becomes a rule. The keyword-by-keyword
contract is docs/guided-decoding.md's; normalization ($ref, allOf, anyOf/oneOf) is in
json.schema_norm, negation in json.schema_neg, enum evaluation in json.schema_eval.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal

from gdserve.grammar.errors import GrammarError, RecursiveSchemaError, RegexTooLargeError, UnsatisfiableSchemaError
from gdserve.grammar.json.formats import format_pattern, is_known_format
from gdserve.grammar.json.numbers import (Bound, common_multiple, decimal_range_regex, int_bounds, int_range_regex,
                                          multiples_regex)
from gdserve.grammar.json.patterns import StringSpec, matches_everything, provably_disjoint
from gdserve.grammar.json.schema_eval import pattern_test
from gdserve.grammar.json.schema_neg import has_ref
from gdserve.grammar.json.schema_model import (
    INSTANCE_TYPES,
    Alternatives,
    MergedSchema,
    Subschema,
    pointer_token,
    show_pointer,
)
from gdserve.grammar.json.schema_norm import Normalizer
from gdserve.grammar.json.values import instance_types, json_equal, unique_json
from gdserve.grammar.json.keys import key_placeholder, key_regex
from gdserve.grammar.json.strings import (
    CHAR,
    Limits,
    repeat,
    string_literal,
)
from gdserve.grammar.regex.nfa import expanded_size
from gdserve.grammar.regex.tree import parse, placeholder

ANY_VALUE_DEPTH = 2
STRING_LENGTH_CAP = 256
ITEMS_CAP = 64
MAX_MIN_BOUND = 1000
MAX_BRANCHES = 256
UNIQUE_SEQUENCES_LIMIT = 2000
# ~200k regex characters take outlines-core ~15 s to index over a 49k-token vocabulary
MAX_REGEX_CHARS = 200_000
# Bounded repetitions written out (regex.tree's node.size): ~0.2 ms of indexing each; checked on
# regexes longer than EXPANSION_CHECK_CHARS (shorter ones index in milliseconds).
MAX_EXPANDED_SIZE = 40_000
EXPANSION_CHECK_CHARS = 4_000
# On the grammar path a subschema whose regex is longer becomes a rule: terminals stay small, and
# a subschema reached from many places is written once.
RULE_MIN_CHARS = 500
# open_objects: declared properties in any order up to this many (a rule per subset read so far)
ORDERLESS_MAX = 6

# Whitespace between tokens. After "{", "[", "," and before "}", "]": one space/tab, or a newline
# and an indent of up to 4 spaces/tabs per open container, at most INDENT_MAX (indent=4 to depth 6,
# indent=2 to depth 12, tabs); around ":" and before "," one space or tab at most. Compact,
# json.dumps() and json.dumps(indent=2/4) output all match; nothing loops. Bounding the indent by
# depth keeps the DFA small (each bounded indent costs a state per column).
INDENT_MAX = 24
DEFAULT_WS_BREAK = r"(?:[ \t]?|\n[ \t]{0,24})"  # the deepest form
DEFAULT_WS_INLINE = r"[ \t]?"

_STRING_SCHEMA = {"type": "string"}
_SCALAR_TYPES = {"string", "integer", "fraction", "boolean", "null"}  # json.schema_model.INSTANCE_TYPES
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_INTEGER = r"(?:0|-?[1-9][0-9]*)"
_ANY_STRING = f'"{CHAR}*"'
JSON_VALUE_RULE = "json_value"


@dataclass
class JsonSchemaRegex:
    regex: str
    relaxed: list[str]  # what is not enforced exactly ("keyword at /pointer (note)")
    narrowed: list[str]  # where the regex is stricter than the schema (lowered upper bounds)
    unique_items: list[str] = field(default_factory=list)  # uniqueItems left to the matcher (json.unique)


def schema_to_regex(schema: dict | bool | str, whitespace_pattern: str | None = None,
                    lenient: bool = False, *, open_objects: bool = False,
                    max_regex_chars: int = MAX_REGEX_CHARS) -> tuple[str, list[str]]:
    """Compile a JSON Schema to (regex, relaxed). The contract, keyword by keyword, is in
    docs/guided-decoding.md."""
    r = compile_json_schema(schema, whitespace_pattern, lenient, open_objects=open_objects,
                            max_regex_chars=max_regex_chars)
    return r.regex, r.relaxed


def compile_json_schema(schema: dict | bool | str, whitespace_pattern: str | None = None,
                        lenient: bool = False, *, open_objects: bool = False,
                        max_regex_chars: int = MAX_REGEX_CHARS) -> JsonSchemaRegex:
    """Like schema_to_regex, with the list of narrowed bounds too. Raises GrammarError for an
    unsupported or unsatisfiable schema; RegexTooLargeError for a regex longer than max_regex_chars
    or expanding past MAX_EXPANDED_SIZE (outlines-core would take tens of seconds and gigabytes to
    index it; such schemas want a grammar instead); RecursiveSchemaError for a $ref cycle.
    open_objects: objects admit undeclared keys wherever the schema does (docs/guided-decoding.md,
    "Objects")."""
    schema, ws_inline, ws_break = _prepare(schema, whitespace_pattern)
    c = _Compiler(schema, ws_inline, ws_break, lenient, open_objects=open_objects)
    c.max_regex_chars = max_regex_chars
    rx = c.compile_root()
    if len(rx) > max_regex_chars:
        raise RegexTooLargeError(f"schema too large for the regex compiler: {len(rx)} regex characters "
                                 f"(limit {max_regex_chars})")
    if len(rx) > EXPANSION_CHECK_CHARS and (size := _expanded_size(rx)) > MAX_EXPANDED_SIZE:
        raise RegexTooLargeError(f"schema too large for the regex compiler: its regex expands to {size} "
                                 f"positions (limit {MAX_EXPANDED_SIZE})")
    return JsonSchemaRegex(rx, list(dict.fromkeys(c.relaxed)), list(dict.fromkeys(c.narrowed)),
                           list(dict.fromkeys(c.unique_items)))


def _expanded_size(rx: str) -> int:
    size = expanded_size(rx)
    return parse(rx).size if size is None else size


@dataclass
class JsonSchemaRules:
    """The grammar path's form (json.schema_cfg): regexes with rule placeholders in them
    (regex.tree.placeholder), for the root and for each rule."""
    root: str
    rules: dict[str, str]
    relaxed: list[str]
    narrowed: list[str]
    unique_items: list[str] = field(default_factory=list)  # as JsonSchemaRegex.unique_items


def compile_json_schema_rules(schema: dict | bool | str, whitespace_pattern: str | None = None,
                              lenient: bool = False, *, open_objects: bool = False) -> JsonSchemaRules:
    """compile_json_schema where a position reached again inside itself (a $ref cycle through an
    object or array) becomes a rule, and unconstrained values are the exact `json_value` rule (any
    JSON, any depth). Whitespace: the default breaks indent up to INDENT_MAX at any depth."""
    schema, ws_inline, ws_break = _prepare(schema, whitespace_pattern)
    c = _Compiler(schema, ws_inline, ws_break or DEFAULT_WS_BREAK, lenient, rules=_Rules(),
                  open_objects=open_objects)
    root = c.compile_root()
    return JsonSchemaRules(root, c.rules.bodies, list(dict.fromkeys(c.relaxed)), list(dict.fromkeys(c.narrowed)),
                           list(dict.fromkeys(c.unique_items)))


def _prepare(schema, whitespace_pattern: str | None) -> tuple[dict | bool, str, str | None]:
    """(schema, inline whitespace, break whitespace or None for the depth-bounded default)."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise GrammarError(f"schema is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"schema must be a JSON object or a boolean, not {type(schema).__name__}")
    if whitespace_pattern is None:
        return schema, DEFAULT_WS_INLINE, None
    try:
        re.compile(whitespace_pattern)
    except re.error as e:
        raise GrammarError(f"whitespace_pattern is not a valid regex: {e}") from None
    return schema, f"(?:{whitespace_pattern})", f"(?:{whitespace_pattern})"


@dataclass
class _Rules:
    bodies: dict[str, str] = field(default_factory=dict)  # rule name -> regex with placeholders
    names: dict[tuple, str] = field(default_factory=dict)  # position key -> rule name
    active: set[tuple] = field(default_factory=set)  # positions being compiled (a cycle's entry)
    by_body: dict[str, str] = field(default_factory=dict)  # a large subschema's regex -> its rule


def _open_object_error(n: MergedSchema) -> RecursiveSchemaError:
    """Undeclared members anywhere among the declared ones: a regex repeats them at each position
    (with a bounded any-value: DFAs of 10^4-10^5 states); the grammar path writes them once,
    values exact at any depth."""
    return RecursiveSchemaError(f"object at {show_pointer(n.ptr)} admits undeclared keys among its declared "
                                "ones (open_objects): a grammar")


def _presence_sets(names: list[str], kind: str, branches: tuple) -> set[frozenset]:
    """The sets of member indices an object may close with: some branch (oneOf: exactly one)
    has its required names among them and none of its absent ones."""
    out = set()
    for s in _subsets(frozenset(range(len(names)))):
        keys = {names[j] for j in s}
        hits = sum(1 for req, absent in branches if req <= keys and not absent & keys)
        if hits == 1 or (hits > 1 and kind == "anyOf"):
            out.add(s)
    return out


def _subsets(s: frozenset) -> list[frozenset]:
    items, out = sorted(s), []
    for mask in range(1 << len(items)):
        out.append(frozenset(x for i, x in enumerate(items) if mask >> i & 1))
    return out


def _frac_digits(d: Decimal) -> int:
    exp = d.normalize().as_tuple().exponent
    return max(0, -exp)


def _num_literal(v) -> str:
    """Regex for a JSON number equal to v (1 also as 1.0, 1.5 also as 1.50)."""
    d = Decimal(repr(v)) if isinstance(v, float) else Decimal(v)
    if d == 0:
        return "0(?:\\.0+)?"
    sign = "-" if d < 0 else ""
    d = abs(d)
    if d == d.to_integral_value():
        return f"{sign}{int(d)}(?:\\.0+)?"
    s = format(d.normalize(), "f")
    ip, fp = s.split(".")
    return f"{sign}{ip}\\.{fp}0*"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int_literal(v) -> str:
    """Regex for an integral JSON number written as an integer (no fraction, no exponent)."""
    return str(int(Decimal(repr(v)) if isinstance(v, float) else v))


class _Compiler(Normalizer):
    def __init__(self, root, ws_inline: str, ws_break: str, lenient: bool, parent: "_Compiler | None" = None,
                 rules: _Rules | None = None, open_objects: bool = False):
        super().__init__(root, lenient, parent)
        self.open_objects = open_objects if parent is None else parent.open_objects
        self.max_regex_chars = MAX_REGEX_CHARS if parent is None else parent.max_regex_chars
        self.rules = rules
        self.rules_mode = rules is not None
        # pointers of the uniqueItems the matcher enforces (json.unique), shared with sub-compilers
        self.unique_items: list[str] = [] if parent is None else parent.unique_items
        self.wsi = ws_inline
        self._wsb = ws_break  # None: the default, bounded by nesting depth
        self.depth = 0  # containers open around the value being compiled
        self.memo: dict = {}
        self._any: dict[tuple[int, int], str] = {}
        self._nows: _Compiler | None = None

    # ----------------------------------------------------------------------------- compiling

    def compile_root(self) -> str:
        rx = self.compile([Subschema(self.root, "", frozenset())])
        if rx is None:
            raise UnsatisfiableSchemaError(self.unsat[0] if self.unsat else "schema is unsatisfiable: no JSON value matches it")
        return rx

    def compile(self, conj: list[Subschema], width: int = 1) -> str | None:
        if self.rules is None:
            out = self._compile(conj, width)
            if out is not None and len(out) > self.max_regex_chars:  # no need to finish the whole
                raise RegexTooLargeError(f"schema too large for the regex compiler: the regex of "
                                         f"{show_pointer(conj[0].ptr)} alone has {len(out)} characters "
                                         f"(limit {self.max_regex_chars})")
            return out
        # Grammar path: $ref cycles are cut here, where a position is reached again inside itself
        # (refs on the path are dropped, so only a cycle with no container in it still raises).
        conj = [replace(s, refs=frozenset()) for s in conj]
        key = tuple((s.ptr, id(s.schema), s.skip) for s in conj)
        rules = self.rules
        if key in rules.active or rules.names.get(key) in rules.bodies:
            return placeholder(rules.names.setdefault(key, f"r{len(rules.names)}"))
        rules.active.add(key)
        try:
            out = self._compile(conj, width)
        finally:
            rules.active.discard(key)
        if out is None:
            return out
        if key not in rules.names:
            if len(out) < RULE_MIN_CHARS:
                return out
            # a large subschema: a rule of its own, one for every position that compiles alike
            rules.names[key] = rules.by_body.setdefault(out, f"r{len(rules.names)}")
        rules.bodies[rules.names[key]] = out
        return placeholder(rules.names[key])

    def _compile(self, conj: list[Subschema], width: int = 1) -> str | None:
        key = (self.depth, tuple((s.ptr, id(s.schema), s.skip) for s in conj))
        if key in self.memo:
            return self.memo[key]
        res = self.normalize(conj)
        if res is None:
            out = None
        elif isinstance(res, Alternatives) and (merged := self._presence_node(res)) is not None:
            out = self.compile_node(merged)
        elif isinstance(res, Alternatives):
            width *= len(res.conjs)
            if width > MAX_BRANCHES:
                raise GrammarError(f"anyOf/oneOf at {show_pointer(res.ptr)}: more than {MAX_BRANCHES} combined "
                                   "branches")
            parts = [self.compile(c, width) for c in res.conjs]
            if res.kind == "oneOf" and len(res.conjs) > 1 and not self._pairwise_disjoint(res.conjs):
                parts = self._one_of(res, parts, width)
            parts = list(dict.fromkeys(p for p in parts if p is not None))
            out = None if not parts else parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
        else:
            out = self.compile_node(res)
        self.memo[key] = out
        return out

    def _presence_node(self, res: Alternatives) -> MergedSchema | None:
        """anyOf/oneOf whose branches are one open object that differ only in which declared
        properties are required or absent (`"oneOf": [{"required": ["a"]}, {"required": ["b"]}]`
        beside `properties`): one object whose member rules, which track the declared keys read,
        close only where the branches allow (grammar path, open objects: _interleaved). As
        separate objects the branches would share every prefix, which no LALR(1) grammar decides.
        None where this does not apply."""
        if self.rules is None or not self.open_objects:
            return None
        nodes = [self.normalize(c) for c in res.conjs]
        if not all(isinstance(n, MergedSchema) and n.types == {"object"} for n in nodes):
            return None
        first = nodes[0]
        shape = replace(first, required=[], forbidden=set(), presence=None)
        names = set(first.props)
        if (shape.additional is not None or shape.pattern_props or shape.prop_names is not None
                or shape.min_props or shape.max_props is not None or not names or len(names) > ORDERLESS_MAX):
            return None
        for n in nodes:
            if (n.presence is not None or replace(n, required=[], forbidden=set(), ptr=first.ptr) != shape
                    or not set(n.required) <= names or not n.forbidden <= names):
                return None
        branches = tuple((frozenset(n.required), frozenset(n.forbidden)) for n in nodes)
        return replace(shape, presence=(res.kind, branches))

    def _one_of(self, res: Alternatives, parts: list, width: int) -> list:
        """oneOf whose branches may overlap: made exclusive where the negations allow; else
        anyOf, on request only (it would accept an instance valid in two branches)."""
        exclusive = self.exclusive_branches(res)
        if exclusive is not None:
            out = self._compile_exclusive(res, exclusive, parts, width)
            if out is not None:
                return out
        if not self.lenient:
            raise GrammarError(f"oneOf at {show_pointer(res.ptr)}: the branches are not provably exclusive, "
                               "so 'exactly one' cannot be enforced; lenient mode compiles it as anyOf")
        self.relaxed.append(f"oneOf at {show_pointer(res.ptr)} (compiled as anyOf: branches not provably exclusive)")
        return parts

    def _compile_exclusive(self, res: Alternatives, exclusive, parts: list, width: int) -> list | None:
        """The parts of a oneOf made exclusive, None where a partial negation would empty a
        branch that has values (then it is not worth the narrowing)."""
        per_branch, partial = exclusive
        width = width // len(res.conjs) * max(1, sum(map(len, per_branch)))
        if width > MAX_BRANCHES:
            raise GrammarError(f"oneOf at {show_pointer(res.ptr)}: more than {MAX_BRANCHES} combined branches "
                               "once made exclusive")
        out = []
        for before, conjs in zip(parts, per_branch):
            mine = [self.compile(c, width) for c in conjs]
            if partial and before is not None and all(m is None for m in mine):
                return None
            out += mine
        if partial:
            self.narrowed.append(f"at {show_pointer(res.ptr)}: oneOf made exclusive by excluding more overlap "
                                 "than needed (a negation without a positive form)")
        return out

    def compile_node(self, n: MergedSchema) -> str | None:
        if n.unconstrained():
            return self.any_value(n.ptr)
        if n.enum is not None:
            return self._enum(n)
        types = n.types if n.types is not None else set(INSTANCE_TYPES)
        excluded = self._excluded(n, types)
        parts = []
        if "null" in types and None not in excluded:
            parts.append("null")
        if "boolean" in types:
            bools = [b for b in ("true", "false") if (b == "true") not in excluded]
            if bools:
                parts.append(bools[0] if len(bools) == 1 else "(?:true|false)")
        if "integer" in types or "fraction" in types:
            parts.append(self._number_excluding(n, types, [v for v in excluded
                                                           if instance_types(v) & {"integer", "fraction"}]))
        if "string" in types:
            parts.append(self._string(n, [v for v in excluded if isinstance(v, str)]))
        if "object" in types:
            parts.append(self._object(n))
        if "array" in types:
            parts.append(self._array(n))
        parts = [p for p in parts if p is not None]
        if not parts:
            self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable")
            return None
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

    def _excluded(self, n: MergedSchema, types: set) -> list:
        """Values of n.excluded (not enum/const) that n's types admit; null, booleans and strings
        are excluded exactly, other values only where their type is not admitted."""
        out = []
        for v in n.excluded:
            vt = instance_types(v)
            if not vt & types:
                continue
            if vt & {"object", "array"}:
                self.unsupported("not", n.ptr, f"excluding the value {json.dumps(v)[:40]}")
                continue
            out.append(v)
        return out

    @property
    def sep(self) -> str:
        """Between the members of an object or the items of an array."""
        return f"{self.wsi},{self.wsb}"

    @property
    def wsb(self) -> str:
        """Whitespace where a pretty printer breaks lines (after "{", "[", "," and before "}",
        "]"): by default one space/tab, or a newline and up to 4 spaces/tabs per open container
        (at most INDENT_MAX)."""
        if self._wsb is not None:
            return self._wsb
        return f"(?:[ \\t]?|\\n[ \\t]{{0,{min(INDENT_MAX, 4 * self.depth)}}})"

    def _content(self, conj: list[Subschema], ptr: str) -> str | None:
        """Map values / array items: an unconstrained one nests one level less, so that a
        container with unconstrained contents is as deep as an unconstrained value."""
        if not conj:
            return self.any_value(ptr, ANY_VALUE_DEPTH - 1)
        res = self._peek(conj)
        if isinstance(res, MergedSchema) and res.unconstrained():
            return self.any_value(conj[0].ptr, ANY_VALUE_DEPTH - 1)
        return self.compile(conj)

    def any_value(self, ptr: str, depth: int = ANY_VALUE_DEPTH) -> str:
        if self.rules is not None:
            return self._json_value_rule()
        self.relaxed.append(f"any value at {show_pointer(ptr)} (JSON nested at most {depth} deep)")
        return self._any_rx(depth)

    def _any_rx(self, depth: int) -> str:
        key = (depth, self.depth)
        if key not in self._any:
            if depth == 0:
                self._any[key] = f"(?:null|true|false|{_NUMBER}|{_ANY_STRING})"
            else:
                with self._nested():
                    self._any[key] = self._any_of(self._any_rx(depth - 1))
        return self._any[key]

    def _json_value_rule(self) -> str:
        """The grammar path's unconstrained value: any JSON value, exact at every depth."""
        if JSON_VALUE_RULE not in self.rules.bodies:
            self.rules.bodies[JSON_VALUE_RULE] = self._any_of(placeholder(JSON_VALUE_RULE))
        return placeholder(JSON_VALUE_RULE)

    def _any_of(self, inner: str) -> str:
        """Any JSON value whose container members are `inner`."""
        sep = self.sep
        member = f"{_ANY_STRING}{self.wsi}:{self.wsi}{inner}"
        arr = f"\\[{self.wsb}(?:{inner}(?:{sep}{inner})*{self.wsb})?\\]"
        obj = f"\\{{{self.wsb}(?:{member}(?:{sep}{member})*{self.wsb})?\\}}"
        return f"(?:null|true|false|{_NUMBER}|{_ANY_STRING}|{arr}|{obj})"

    # ---- enum / const

    def literal(self, v) -> str:
        if v is None:
            return "null"
        if v is True:
            return "true"
        if v is False:
            return "false"
        if isinstance(v, (int, float)):
            return _num_literal(v)
        if isinstance(v, str):
            return string_literal(v)
        if not isinstance(v, (list, dict)):
            raise GrammarError(f"not a JSON value: {v!r}")
        self.depth += 1
        try:
            sep = self.sep
            if isinstance(v, list):
                if not v:
                    return f"\\[{self.wsb}\\]"
                return f"\\[{self.wsb}" + sep.join(self.literal(x) for x in v) + f"{self.wsb}\\]"
            if not v:
                return f"\\{{{self.wsb}\\}}"
            body = sep.join(f"{string_literal(k)}{self.wsi}:{self.wsi}{self.literal(x)}" for k, x in v.items())
            return f"\\{{{self.wsb}{body}{self.wsb}\\}}"
        finally:
            self.depth -= 1

    def _enum(self, n: MergedSchema) -> str | None:
        types = n.types if n.types is not None else set(INSTANCE_TYPES)
        vals = [v for v in n.enum if instance_types(v) & types]
        if vals and not n.only_types():
            rest = replace(n, enum=None, types=set().union(*(instance_types(v) for v in vals)) & types)
            check = self._checker(rest)
            vals = [v for v in vals if check.fullmatch(_compact(v))]
        if not vals:
            self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (no enum/const value passes "
                              "the other keywords)")
            return None
        whole = "fraction" not in types  # integers only: 1, not 1.0 (drafts 4 and older read 1.0 as no integer)
        parts = list(dict.fromkeys(_int_literal(v) if whole and _is_number(v) else self.literal(v) for v in vals))
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

    def _checker(self, n: MergedSchema) -> re.Pattern:
        """The regex of n without whitespace, to test enum values against (sound, maybe partial)."""
        if self._nows is None:
            self._nows = _Compiler(self.root, "", "", self.lenient, parent=self)
        sub = self._nows
        sub.relaxed, sub.narrowed = [], []
        rx = sub.compile_node(n)
        self.relaxed += sub.relaxed
        self.narrowed += sub.narrowed
        return re.compile(rx if rx is not None else "(?!)")

    # ---- numbers

    def _number_excluding(self, n: MergedSchema, types: set, excluded: list) -> str | None:
        """n's numbers other than the excluded ones: the range cut at each (exclusive bounds)."""
        cuts = sorted({Decimal(str(v)) for v in excluded})
        cuts = [v for v in cuts if (n.lo is None or v > n.lo.value or v == n.lo.value and not n.lo.exclusive)
                and (n.hi is None or v < n.hi.value or v == n.hi.value and not n.hi.exclusive)]
        if not cuts:
            return self._number(n, types)
        pieces, lo, lo_src = [], n.lo, n.lo_src
        for v in cuts:
            src = ("not", n.ptr, float(v) if v != v.to_integral_value() else int(v))
            pieces.append(self._number(replace(n, lo=lo, lo_src=lo_src, hi=Bound(v, True), hi_src=src), types))
            lo, lo_src = Bound(v, True), src
        pieces.append(self._number(replace(n, lo=lo, lo_src=lo_src), types))
        pieces = [p for p in pieces if p is not None]
        return "(?:" + "|".join(pieces) + ")" if pieces else None

    def _number(self, n: MergedSchema, types: set) -> str | None:
        is_num = "fraction" in types
        if n.multiple_of:
            return self._multiples(n, types)
        if n.lo is None and n.hi is None:
            return _NUMBER if is_num else _INTEGER
        if not is_num:
            return int_range_regex(*int_bounds(n.lo, n.hi))
        cap = None
        for b, src in ((n.lo, n.lo_src), (n.hi, n.hi_src)):
            if b is None:
                continue
            kw, p, raw = src
            risky = b.exclusive or (isinstance(raw, int) and abs(raw) > 2**53)
            if not risky:
                continue
            f = 20 if b.value == 0 else max(0, 14 - b.value.adjusted())
            if f < _frac_digits(b.value):
                self.unsupported(kw, p, f"bound {raw} has too many digits to keep exact under float parsing")
                continue
            cap = f if cap is None else min(cap, f)
        return decimal_range_regex(n.lo, n.hi, cap)

    def _multiples(self, n: MergedSchema, types: set) -> str | None:
        """multipleOf (every step: their least common multiple), exact or unsupported."""
        ptr = n.multiple_of[0][1]
        if "integer" not in types:
            self.unsupported("multipleOf", ptr, "on non-integral numbers only")
            return self._number(replace(n, multiple_of=[]), types)
        step = common_multiple([step for step, _ in n.multiple_of])
        try:
            return multiples_regex(step, n.lo, n.hi, "fraction" not in types)
        except ValueError as e:
            self.unsupported("multipleOf", ptr, str(e))
            return self._number(replace(n, multiple_of=[]), types)

    # ---- strings

    def _string(self, n: MergedSchema, excluded: list[str] = ()) -> str | None:
        if excluded:
            if n.formats or n.patterns or n.min_len > 0 or n.max_len is not None:
                self.unsupported("not", n.ptr, "excluded strings together with pattern/format/length")
            else:
                return key_regex(tuple(excluded))
        specs = []
        for fmt, p in n.formats:
            if not is_known_format(fmt):
                self.relaxed.append(f"format '{fmt}' at {show_pointer(p)} (not a JSON Schema format: an annotation)")
                continue
            pat = format_pattern(fmt)
            if pat is None:
                self.unsupported(f"format '{fmt}'", p)
                continue
            specs.append((StringSpec.from_pattern(pat), "format", p))
        for pat, p in n.patterns:
            try:
                specs.append((StringSpec.from_pattern(pat), "pattern", p))
            except GrammarError as e:
                self.unsupported("pattern", p, str(e))
        if len(specs) > 1:
            _, first, first_ptr = specs[0]
            for _, keyword, p in specs[1:]:
                self.unsupported(keyword, p, f"together with {first} at {show_pointer(first_ptr)}: an intersection")
        spec, where = (specs[0][0], specs[0][2]) if specs else (StringSpec.any(), n.ptr)
        if n.min_len > 0 or n.max_len is not None:
            constrained = spec.with_length(n.min_len, n.max_len)
            if constrained is None:
                self.unsupported("minLength/maxLength", n.ptr, "together with a pattern/format of this shape")
            else:
                spec, narrowed = constrained
                if narrowed:
                    self.narrowed.append(f"at {show_pointer(n.ptr)}: pattern repetitions bounded to keep within "
                                         f"maxLength {n.max_len}")
        sources = ["maxLength"] * (n.max_len is not None) + [keyword for _, keyword, _ in specs[:1]]
        limits = Limits(STRING_LENGTH_CAP, MAX_MIN_BOUND, "/".join(sources) or "repetition")
        return spec.emit(limits, self.narrowed, show_pointer(where))

    # ---- objects

    @contextmanager
    def _nested(self):
        """One container deeper while its body compiles (the whitespace indent follows depth)."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def _object(self, n: MergedSchema) -> str | None:
        with self._nested():
            return self._object_body(n)

    def _object_body(self, n: MergedSchema) -> str | None:
        names = list(n.props) + [r for r in n.required if r not in n.props]
        if (self.rules is None and self.open_objects and names and n.additional is None and not n.pattern_props
                and n.prop_names is None and n.max_props is None):
            # what the check below finds once the members are compiled, known now: the grammar
            # path's compile need not wait for the regex path's (the whole schema, at the root)
            raise _open_object_error(n)
        kept_out = names + sorted(f for f in n.forbidden if f not in names)  # keys extra keys never spell
        members = self._declared_members(n, names)
        if members is None:
            return None
        extra, key = self._undeclared_value(n, names, kept_out)
        if n.prop_names is not None:
            named = self._property_names(n, names, members, extra, key)
            if named is None:
                return None
            members, extra, key = named
        return self._object_regex(n, members, extra, key)

    def _declared_members(self, n: MergedSchema, names: list[str]) -> list[tuple[str, bool, str]] | None:
        """(name, required, "key: value") of each declared property that can appear; None if a
        required one can't."""
        members = []
        for name in names:
            if name in n.forbidden:
                if name in n.required:
                    self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (property '{name}' "
                                      "both required and excluded)")
                    return None
                continue
            conj = n.props.get(name)
            if conj is None:  # required but not in properties: additionalProperties applies
                conj = n.additional or []
            value = self.compile(conj) if conj else self.any_value(f"{n.ptr}/properties/{pointer_token(name)}")
            req = name in n.required
            if value is None:
                if req:
                    self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (required property "
                                      f"'{name}' admits no value)")
                    return None
                continue
            members.append((name, req, f"{string_literal(name)}{self.wsi}:{self.wsi}{value}"))
        return members

    def _undeclared_value(self, n: MergedSchema, names: list[str],
                          kept_out: list[str]) -> tuple[str | None, str | None]:
        """(extra, key) of the members no declared name takes: extra, their value, None if there are
        none; key, their key, None where extra holds the whole member (patternProperties)."""
        if n.pattern_props:
            return self._pattern_members(n, kept_out), None
        if n.additional is not None or not names or self.open_objects:
            extra = self._content(n.additional or [], f"{n.ptr}/additionalProperties")
            return extra, None if extra is None else self._other_key(tuple(kept_out))
        self.narrowed.append(f"at {show_pointer(n.ptr)}: only the declared properties (no additionalProperties: "
                             "other keys left out unless open_objects)")
        return None, None

    def _property_names(self, n: MergedSchema, names: list[str], members: list, extra: str | None,
                        key: str | None) -> tuple[list, str | None, str | None] | None:
        """(members, extra, key) with propertyNames applied: the declared members it admits, the
        undeclared members' key; None if a required name fails it."""
        if n.pattern_props or n.forbidden:
            self.unsupported("propertyNames", n.prop_names[0].ptr,
                             "together with patternProperties or excluded names")
            return members, extra, key
        pn_ptr = n.prop_names[0].ptr
        key_rx = self.compile(n.prop_names + [Subschema(_STRING_SCHEMA, pn_ptr, frozenset())])
        check = re.compile(key_rx) if key_rx is not None else None

        def ok(nm: str) -> bool:
            return check is not None and check.fullmatch(json.dumps(nm, ensure_ascii=False)) is not None

        for nm in names:
            if nm in n.required and not ok(nm):
                self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (required property "
                                  f"'{nm}' fails propertyNames)")
                return None
        members = [m for m in members if ok(m[0])]
        if extra is None:
            return members, extra, key
        if names and n.additional is None:  # open_objects: other keys would need both key regexes
            self.narrowed.append(f"at {show_pointer(n.ptr)}: only the declared properties (propertyNames "
                                 "beside declared properties)")
            return members, None, key
        if names:
            self.unsupported("propertyNames", pn_ptr, "declared and additional properties together")
            return members, extra, key
        return members, None if key_rx is None else extra, key_rx

    def _object_regex(self, n: MergedSchema, members: list, extra: str | None, key: str | None) -> str | None:
        """The object of the declared members and of undeclared ones (extra, key: _undeclared_value)."""
        map_max = None
        if extra is not None and not members and n.max_props is not None:
            # a pure map: maxProperties bounds the members (a repeated key only counts extra: sound)
            map_max = n.max_props
            if map_max == 0:
                extra = None
        interleave = None
        if extra is not None:
            member = extra if key is None else f"{key}{self.wsi}:{self.wsi}{extra}"
            interleave = self._add_undeclared(n, members, member, map_max)
        counted = [(r, m) for _, r, m in members]
        nonempty = self._property_counts(n, counted, map_max if extra is not None else len(counted))
        if nonempty is None:
            return None
        if not counted:
            return f"\\{{{self.wsb}\\}}"
        if interleave is not None:
            return self._interleaved(*interleave, nonempty, n.ptr, n.presence)
        body, empty_ok = _join(counted, self.sep)
        if empty_ok and not nonempty:
            return f"\\{{{self.wsb}(?:{body}{self.wsb})?\\}}"
        return f"\\{{{self.wsb}{body}{self.wsb}\\}}"

    def _add_undeclared(self, n: MergedSchema, members: list, member: str, map_max: int | None) -> tuple | None:
        """Append the undeclared members (any number of them, or up to map_max) to members; returns
        (declared members, undeclared member) where the two interleave (open_objects)."""
        if map_max is None:
            rest = f"(?:{self.sep}{member})*"
        else:
            limits = Limits(ITEMS_CAP, MAX_MIN_BOUND, "maxProperties")
            rest = repeat(f"{self.sep}{member}", 0, map_max - 1, limits, self.narrowed,
                          show_pointer(n.max_props_ptr))
        interleave = None
        if self.open_objects and members and map_max is None:
            if self.rules is None:
                raise _open_object_error(n)
            interleave = (list(members), member)
        members.append(("", False, member + rest))
        return interleave

    def _property_counts(self, n: MergedSchema, counted: list[tuple[bool, str]],
                         hi_count: int | None) -> bool | None:
        """minProperties/maxProperties against the members' counts (required ones at least,
        hi_count at most): whether the object must be nonempty though every member is optional;
        None if no count fits."""
        lo_count = sum(1 for r, _ in counted if r)
        nonempty = False
        if n.min_props > lo_count:
            if lo_count == 0 and n.min_props == 1:
                nonempty = True
            else:
                self.unsupported("minProperties", n.min_props_ptr)
        if n.max_props is not None and (hi_count is None or hi_count > n.max_props):
            if n.max_props < lo_count:
                self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (maxProperties)")
                return None
            self.unsupported("maxProperties", n.max_props_ptr)
        if not counted and nonempty:
            self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (minProperties)")
            return None
        return nonempty

    def _interleaved(self, members: list[tuple[str, bool, str]], extra: str, nonempty: bool, ptr: str,
                     presence: tuple | None = None) -> str | None:
        """An object (grammar path) in JSON Schema's semantics: the declared members in any order
        (in schema order past ORDERLESS_MAX of them: narrowed), each at most once, with undeclared
        ones (`extra`, "key: value") before, between and after them. Right-linear rules keep it
        LALR: rule A_s, for the set s of declared members read so far (or, in schema order, the
        position), reads "," and then an undeclared member, staying in A_s, or a declared member
        j that s admits next, going on in A_{s+j}; A_s may stop once every required member is in
        s. Each choice is made by the key after the ",", and undeclared keys never spell a
        declared name. With `presence` (merged anyOf/oneOf branches, _presence_node), A_s may
        stop where some branch (oneOf: exactly one) has its required names in s and none of its
        absent ones, and a member is read only if some such s can still be reached."""
        sep = self.sep
        rules, n = self.rules, len(members)
        required = frozenset(j for j, (_, req, _) in enumerate(members) if req)
        # Rules, so that "," stays a terminal of its own rather than fused into a copy of every
        # member's first terminal (and one rule per member body, shared by every subset state).
        declared = [self._rule(rx) for _, _, rx in members]
        extra = self._rule(extra)
        if presence is not None:
            start = frozenset()
            good = _presence_sets([name for name, _, _ in members], *presence)
            viable = {s for g in good for s in _subsets(g)}
            if start not in viable:
                self.unsat.append(f"schema at {show_pointer(ptr)} is unsatisfiable (no object has the keys "
                                  f"its {presence[0]} branches require)")
                return None

            def nexts(s: frozenset) -> list[tuple[int, frozenset]]:
                return [(j, s | {j}) for j in range(n) if j not in s and s | {j} in viable]

            def can_stop(s: frozenset) -> bool:
                return s in good
        elif n <= ORDERLESS_MAX:
            start: frozenset | int = frozenset()

            def nexts(s: frozenset) -> list[tuple[int, frozenset]]:
                return [(j, s | {j}) for j in range(n) if j not in s]

            def can_stop(s: frozenset) -> bool:
                return required <= s
        else:
            self.narrowed.append(f"at {show_pointer(ptr)}: declared properties in schema order (more than "
                                 f"{ORDERLESS_MAX})")
            start = 0

            def nexts(i: int) -> list[tuple[int, int]]:
                out = []
                for j in range(i, n):
                    out.append((j, j + 1))
                    if j in required:
                        break  # a required member can't be skipped
                return out

            def can_stop(i: int) -> bool:
                return not any(j >= i for j in required)

        prefix = f"o{len(rules.bodies)}_"
        names, todo = {start: f"{prefix}0"}, [start]
        while todo:  # name every reachable state first, then write the rules
            for _, t in nexts(todo.pop()):
                if t not in names:
                    names[t] = f"{prefix}{len(names)}"
                    todo.append(t)

        def choices(s, lead: str) -> list[str]:
            return ([f"{lead}{extra}{placeholder(names[s])}"]
                    + [f"{lead}{declared[j]}{placeholder(names[t])}" for j, t in nexts(s)])

        for s, name in names.items():
            body = "(?:" + "|".join(choices(s, sep)) + ")"
            rules.bodies[name] = body if not can_stop(s) else body + "?"
        first = "(?:" + "|".join(choices(start, "")) + ")"
        if not can_stop(start) or nonempty:
            return f"\\{{{self.wsb}{first}{self.wsb}\\}}"
        return f"\\{{{self.wsb}(?:{first}{self.wsb})?\\}}"

    def _rule(self, body: str) -> str:
        """A placeholder for a rule with this body (one rule per distinct body)."""
        rules = self.rules
        name = rules.by_body.get(body)
        if name is None:
            name = rules.by_body[body] = f"m{len(rules.bodies)}"
            rules.bodies[name] = body
        return placeholder(name)

    def _pattern_members(self, n: MergedSchema, names: list[str]) -> str | None:
        """One member whose key matches a patternProperties pattern, "key: value" (None: no such
        key can appear). Keys never spell a declared name; other keys are left out (narrowed unless
        additionalProperties forbids them or a pattern takes every key)."""
        specs = []
        for q, p, conj in n.pattern_props:
            try:
                specs.append((q, p, conj, StringSpec.from_pattern(q)))
            except GrammarError as e:
                self.unsupported("patternProperties", p, str(e))
        for i, (q, p, conj, spec) in enumerate(specs):
            for q2, _, conj2, spec2 in specs[:i]:
                if not provably_disjoint(spec, spec2) and [x.schema for x in conj] != [x.schema for x in conj2]:
                    self.unsupported("patternProperties", p, f"patterns {q2!r} and {q!r} may both match a key")
        everything = any(matches_everything(spec) for *_, spec in specs)
        closed = n.additional is not None and any(x.schema is False for x in n.additional)
        if not closed and not everything:
            self.narrowed.append(f"at {show_pointer(n.ptr)}: only declared and patternProperties keys "
                                 "(keys matching no pattern left out)")
        limits = Limits(STRING_LENGTH_CAP, MAX_MIN_BOUND, "patternProperties")
        alts = []
        for q, p, conj, spec in specs:
            if any(pattern_test(q, d) is not False and not self._pattern_covers(n, d, conj) for d in names):
                if not matches_everything(spec):
                    self.unsupported("patternProperties", p, f"pattern {q!r} matches a declared property name")
                    continue
                key = self._other_key(tuple(names))
            else:
                key = spec.emit(limits, self.narrowed, show_pointer(p))
            value = self._content(conj, p)
            if key is not None and value is not None:
                alts.append(f"{key}{self.wsi}:{self.wsi}{value}")
        alts = list(dict.fromkeys(alts))
        if not alts:
            return None
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    def _other_key(self, names: tuple[str, ...]) -> str:
        """A key whose decoded value is none of names: on the grammar path the placeholder of the
        DFA json.keys builds directly."""
        return key_placeholder(names) if self.rules_mode else key_regex(names)

    def _pattern_covers(self, n: MergedSchema, name: str, conj: list[Subschema]) -> bool:
        """A key `name` spelled by a pattern's member gets only the pattern's schemas: exact where
        the declared property asks nothing more (each of its schemas is one of the pattern's, or
        asserts nothing)."""
        if name in n.forbidden or name not in n.props:
            return False
        mine = [x.schema for x in conj]

        def implied(sub: Subschema) -> bool:
            if any(sub.schema is y for y in mine):
                return True
            if not has_ref(sub.schema) and any(json_equal(_assertions(sub.schema), _assertions(y)) for y in mine):
                return True  # equal without $ref: the same wherever it sits
            node = self._peek([sub])
            return isinstance(node, MergedSchema) and node.unconstrained()
        return all(implied(x) for x in n.props[name])

    # ---- arrays

    def _array(self, n: MergedSchema) -> str | None:
        with self._nested():
            return self._array_body(n)

    def _array_body(self, n: MergedSchema) -> str | None:
        if n.contains:
            rx = self._contains_array(n)
            if rx is not False:
                return rx
        sep = self.sep
        lo, hi = n.min_items, n.max_items
        prefix: list[str] = []
        for i, conj in enumerate(n.prefix):
            rx = self.compile(conj)
            if rx is None:
                hi = i if hi is None else min(hi, i)
                break
            prefix.append(rx)
        if hi is not None and hi <= len(prefix):
            extra = None
        else:
            extra = self._content(n.items or [], f"{n.ptr}/items")
        if extra is None:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and lo > hi:
            self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (minItems > possible items)")
            return None
        if lo > MAX_MIN_BOUND:
            raise GrammarError(f"minItems {lo} at {show_pointer(n.ptr)} exceeds the supported {MAX_MIN_BOUND}")
        if n.unique is not None and (hi is None or hi > 1):
            uniq = self._unique(n, lo, hi, prefix, extra)
            if uniq is not False:
                return uniq
        if hi is not None and hi > max(lo, ITEMS_CAP):
            self.narrowed.append(f"at {show_pointer(n.ptr)}: maxItems {hi} lowered to {max(lo, ITEMS_CAP)}")
            hi = max(lo, ITEMS_CAP)
        if hi == 0:
            return f"\\[{self.wsb}\\]"
        limits = Limits(ITEMS_CAP, MAX_MIN_BOUND, "maxItems")

        def seq(i: int) -> str:
            cur = prefix[i] if i < len(prefix) else extra
            if hi is not None and i + 1 >= hi:
                return cur
            if i + 1 >= len(prefix):
                if extra is None:
                    return cur
                r_lo = max(0, lo - (i + 1))
                r_hi = None if hi is None else hi - (i + 1)
                return cur + repeat(f"{sep}{extra}", r_lo, r_hi, limits, self.narrowed, show_pointer(n.ptr))
            nxt = sep + seq(i + 1)
            return cur + (nxt if i + 1 < lo else f"(?:{nxt})?")

        body = seq(0)
        if lo == 0:
            return f"\\[{self.wsb}(?:{body}{self.wsb})?\\]"
        return f"\\[{self.wsb}{body}{self.wsb}\\]"

    def _contains_array(self, n: MergedSchema) -> str | None | bool:
        """contains / minContains / maxContains: every item either matches the contains schema (A:
        items and contains) or not (B: items and the negation of contains), and the A items number
        minContains .. maxContains. False (lenient) to build the array without it."""
        if len(n.contains) > 1 or n.prefix or n.min_items or n.max_items is not None or n.unique:
            self.unsupported("contains", n.ptr, "together with prefixItems, minItems, maxItems, uniqueItems "
                                                "or another contains")
            return False
        sub, lo, hi = n.contains[0]
        negation = self.negation().negate(sub)
        if negation is None:
            self.unsupported("contains", n.ptr, "its schema has no negation this compiler can build")
            return False
        items = n.items or []
        a = self.compile(items + [sub])
        b_alts = [rx for rx in (self.compile(items + alt) for alt in negation) if rx is not None]
        b = "|".join(b_alts) if b_alts else None
        if a is None:
            hi = 0
        if lo > (hi if hi is not None else lo):
            self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (minContains > possible items)")
            return None
        sep = self.sep
        before = "" if b is None else f"(?:(?:{b}){sep})*"   # B items, each followed by a separator
        after = "" if b is None else f"(?:{sep}(?:{b}))*"    # B items, each preceded by one
        with_a = None
        if a is not None and hi != 0:
            more = repeat(f"{sep}{before}(?:{a}){after}", max(lo - 1, 0), None if hi is None else hi - 1,
                          Limits(ITEMS_CAP, MAX_MIN_BOUND, "maxItems"), self.narrowed, show_pointer(n.ptr))
            with_a = f"{before}(?:{a}){after}{more}"
        if lo > 0:
            return f"\\[{self.wsb}{with_a}{self.wsb}\\]"
        options = [x for x in (None if b is None else f"(?:{b}){after}", with_a) if x is not None]
        if not options:
            return f"\\[{self.wsb}\\]"
        return f"\\[{self.wsb}(?:(?:{'|'.join(options)}){self.wsb})?\\]"

    def _unique(self, n: MergedSchema, lo: int, hi: int | None, prefix: list[str], extra: str | None):
        """uniqueItems: exact regex, or False to build the array without it (only when implied)."""
        sep = self.sep
        if prefix:
            # tuples whose positions are pairwise disjoint never repeat a value
            conjs = n.prefix[:len(prefix)]
            if extra is None and self._pairwise_disjoint(conjs):
                return False
            self.unsupported("uniqueItems", n.unique, "prefixItems whose positions may be equal")
            return False
        values = self._finite_values(n.items) if n.items is not None else None
        if values is None:
            return self._unique_in_matcher(n)
        k = len(values)
        if k == 0:
            return f"\\[{self.wsb}\\]" if lo == 0 else None
        hi = k if hi is None else min(hi, k)
        if lo > hi:
            self.unsat.append(f"schema at {show_pointer(n.ptr)} is unsatisfiable (uniqueItems with minItems)")
            return None
        total, perms = 0, 1
        for m in range(1, hi + 1):
            perms *= k - m + 1
            total += perms
        if total > UNIQUE_SEQUENCES_LIMIT:
            return self._unique_in_matcher(n)
        lits = [self.literal(v) for v in values]

        def rest(avail: tuple, count: int) -> str:
            alts = []
            if count >= lo:
                alts.append("")
            if count < hi:
                for i in avail:
                    alts.append(sep + lits[i] + rest(tuple(j for j in avail if j != i), count + 1))
            return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

        firsts = [lits[i] + rest(tuple(j for j in range(k) if j != i), 1) for i in range(k)]
        body = "(?:" + "|".join(firsts) + ")"
        if lo == 0:
            return f"\\[{self.wsb}(?:{body}{self.wsb})?\\]"
        return f"\\[{self.wsb}{body}{self.wsb}\\]"

    def _unique_in_matcher(self, n: MergedSchema) -> bool:
        """uniqueItems over scalar items that no regex can enumerate: the array is built without
        it and the matcher refuses duplicates (json.unique); False either way."""
        if n.items is None or not self._scalar_items(n.items):
            self.unsupported("uniqueItems", n.unique, "items may be objects or arrays: only scalar items "
                                                      "(strings, numbers, booleans, null) are kept unique")
            return False
        self.unique_items.append(n.unique)
        return False

    def _scalar_items(self, conj: list[Subschema]) -> bool:
        res = self.normalize(conj)
        if res is None:
            return True
        if isinstance(res, Alternatives):
            return all(self._scalar_items(c) for c in res.conjs)
        if res.enum is not None:
            return all(not isinstance(v, (dict, list)) for v in res.enum)
        return res.types is not None and res.types <= _SCALAR_TYPES

    def _finite_values(self, conj: list[Subschema]) -> list | None:
        res = self.normalize(conj)
        if res is None:
            return []
        if isinstance(res, Alternatives):
            out: list = []
            for c in res.conjs:
                vs = self._finite_values(c)
                if vs is None:
                    return None
                out += vs
            return unique_json(out)
        if res.enum is not None:
            vals = res.enum
        elif res.types is not None and res.types <= {"null", "boolean"}:
            vals = [v for v, t in ((None, "null"), (True, "boolean"), (False, "boolean")) if t in res.types]
        else:
            return None
        types = res.types if res.types is not None else set(INSTANCE_TYPES)
        vals = [v for v in vals if instance_types(v) & types]
        if vals and not res.only_types():
            check = self._checker(replace(res, enum=None))
            vals = [v for v in vals if check.fullmatch(_compact(v))]
        return vals


_ANNOTATIONS = ("title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                "writeOnly")


def _assertions(schema):
    """The schema without its top-level annotations (for comparing schemas)."""
    if not isinstance(schema, dict):
        return schema
    return {k: v for k, v in schema.items() if k not in _ANNOTATIONS}


def _compact(v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, list):
        return "[" + ",".join(_compact(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _compact(x) for k, x in v.items()) + "}"
    return json.dumps(v, ensure_ascii=False)


def _join(members: list[tuple[bool, str]], sep: str) -> tuple[str, bool]:
    """Members in order, each optional or required, comma-separated. Returns (regex, empty_ok).

    Linear in size: optional members before the first required one carry a trailing separator,
    the others a leading one. When all are optional, a nonempty subsequence is built by folding:
    F(m1..mj) = F(m1..mj-1)(,mj)? | mj, so each member appears twice; in blocks of 32 (folded the
    same way) to keep the group nesting shallow for Rust's regex parser."""
    first_req = next((i for i, (r, _) in enumerate(members) if r), None)
    if first_req is not None:
        pre = "".join(f"(?:{m}{sep})?" for _, m in members[:first_req])
        post = "".join(f"{sep}{m}" if r else f"(?:{sep}{m})?" for r, m in members[first_req + 1:])
        return pre + members[first_req][1] + post, False
    return _nonempty_subsequence([m for _, m in members], sep), True


def _nonempty_subsequence(items: list[str], sep: str, block: int = 32) -> str:
    if len(items) > block:
        return _nonempty_subsequence([_nonempty_subsequence(items[i:i + block], sep, block)
                                      for i in range(0, len(items), block)], sep, block)
    acc = items[0]
    for m in items[1:]:
        acc = f"(?:{acc}(?:{sep}{m})?|{m})"
    return acc
