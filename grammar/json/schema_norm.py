"""JSON Schema normalization for json.schema: $ref resolution, allOf merging, anyOf/oneOf
distribution, keyword collection, and disjointness (JSON Schema semantics) for oneOf.

A schema position is a conjunction of `Subschema`s (json.schema_model). `normalize` flattens $ref
and allOf, distributes the first anyOf/oneOf (`Alternatives`), or merges everything into one
`MergedSchema` whose child positions are again conjunctions, normalized lazily (so recursion is
found by the $ref cycle check on the path, not by walking the document).
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field, replace
from decimal import Decimal

from gdserve.grammar.errors import GrammarError, RecursiveSchemaError
from gdserve.grammar.json.numbers import Bound
from gdserve.grammar.json.patterns import StringSpec, provably_disjoint
from gdserve.grammar.json.schema_eval import Evaluator, pattern_test
from gdserve.grammar.json.schema_model import (
    EXCLUDED_VALUES,
    FORBIDDEN_NAMES,
    INSTANCE_TYPES,
    TYPES_OF_NAME,
    Alternatives,
    MergedSchema,
    Subschema,
    pointer_token,
    show_pointer,
)
from gdserve.grammar.json.schema_neg import Negator
from gdserve.grammar.json.values import instance_types, json_key, unique_json

_UNSUPPORTED = {"not", "dependentRequired", "dependentSchemas",
                "dependencies", "unevaluatedItems", "unevaluatedProperties",
                "$dynamicRef", "$recursiveRef"}
_DEPENDENCIES = ("dependentRequired", "dependentSchemas", "dependencies")
_UNEVALUATED = ("unevaluatedProperties", "unevaluatedItems")
MAX_REWRITE_BRANCHES = 256
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("not", "if", "then", "else", "additionalProperties", "propertyNames", "contains",
               "unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema")


@dataclass
class _Evaluated:
    """What a schema's in-place applicators evaluate (for unevaluatedProperties / unevaluatedItems)."""
    names: set = field(default_factory=set)
    patterns: list = field(default_factory=list)
    num_items: int = 0
    everything: bool = False

    def evaluates_any(self) -> bool:
        return bool(self.names or self.patterns or self.num_items or self.everything)


def _to_decimal(v, kw: str, ptr: str) -> Decimal:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise GrammarError(f"'{kw}' at {show_pointer(ptr)} must be a number")
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise GrammarError(f"'{kw}' at {show_pointer(ptr)} must be finite")
        return Decimal(repr(v))
    return Decimal(v)


def _to_count(v, kw: str, ptr: str) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GrammarError(f"'{kw}' at {show_pointer(ptr)} must be a non-negative integer")
    return v


class Normalizer:
    """Resolves, merges and reports; json.schema._Compiler builds regexes on top of it."""

    rules_mode = False  # json.schema_cfg's compiler: $ref cycles through containers become rules

    def __init__(self, root, lenient: bool, parent: "Normalizer | None" = None):
        self.root = root
        self.lenient = lenient
        self.relaxed: list[str] = []
        self.narrowed: list[str] = []
        self.unsat: list[str] = []
        self._evaluator = None
        self._negator = None
        self._synthesized: list = []  # schemas made by rewrites, kept alive (memo keys hold ids)
        if parent is None:
            self._ids, self._anchors, self._embedded = self._index_resources(root)
        else:
            self._ids, self._anchors, self._embedded = parent._ids, parent._anchors, parent._embedded

    # ----------------------------------------------------------------------------- reporting

    def unsupported(self, what: str, ptr: str, note: str = "") -> None:
        msg = f"{what} at {show_pointer(ptr)}" + (f" ({note})" if note else "")
        if not self.lenient:
            raise GrammarError(f"unsupported {msg}" if not what.startswith("unsupported") else msg)
        self.relaxed.append(msg)

    def _keyword(self, kw: str, ptr: str) -> None:
        if not self.lenient:
            raise GrammarError(f"unsupported keyword '{kw}' at {show_pointer(ptr)}")
        self.relaxed.append(f"{kw} at {show_pointer(ptr)}")

    # ----------------------------------------------------------------------------- references

    def _index_resources(self, root):
        """$id (absolute, embedded resources) and $anchor locations, walking schema positions."""
        root_id = root.get("$id") if isinstance(root, dict) else None
        base0 = urllib.parse.urldefrag(root_id)[0] if isinstance(root_id, str) else ""
        ids = {base0: ""} if base0 else {}
        anchors: dict[tuple[str, str], str] = {}
        embedded: list[str] = []

        def walk(node, ptr, base):
            if not isinstance(node, dict):
                return
            if ptr and isinstance(node.get("$id"), str) and urllib.parse.urldefrag(node["$id"])[0]:
                base = urllib.parse.urldefrag(urllib.parse.urljoin(base, node["$id"]))[0]
                ids[base] = ptr
                embedded.append(ptr)
            for k in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(k), str):
                    anchors[(base, node[k])] = ptr
            for k in ("$id", "id"):  # drafts 4-7 spell an anchor as a fragment-only id: "#name"
                value = node.get(k)
                if isinstance(value, str) and value.startswith("#") and value[1:2] not in ("", "/"):
                    anchors.setdefault((base, value[1:]), ptr)
            for k in _SCHEMA_MAPS:
                if isinstance(node.get(k), dict):
                    for name, sub in node[k].items():
                        walk(sub, f"{ptr}/{k}/{pointer_token(name)}", base)
            for k in _SCHEMA_LISTS + ("items",):
                if isinstance(node.get(k), list):
                    for i, sub in enumerate(node[k]):
                        walk(sub, f"{ptr}/{k}/{i}", base)
            for k in _SCHEMA_ONE + ("items",):
                if isinstance(node.get(k), dict):
                    walk(node[k], f"{ptr}/{k}", base)

        walk(root, "", base0)
        return ids, anchors, embedded

    def _pointer(self, ptr: str):
        node = self.root
        for tok in ptr.split("/")[1:] if ptr else []:
            tok = tok.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and tok in node:
                node = node[tok]
            elif isinstance(node, list) and tok.isdigit() and int(tok) < len(node):
                node = node[int(tok)]
            else:
                return None, False
        return node, True

    def _base(self, ptr: str) -> tuple[str, str]:
        """(base URI, resource pointer) of the schema resource that contains ptr."""
        best = ""
        for e in self._embedded:
            if (ptr == e or ptr.startswith(e + "/")) and len(e) > len(best):
                best = e
        for uri, rp in self._ids.items():
            if rp == best:
                return uri, best
        return "", best

    def _resolve(self, ref, sub: Subschema) -> Subschema:
        where = show_pointer(sub.ptr)
        if not isinstance(ref, str):
            raise GrammarError(f"$ref at {where} must be a string")
        base, start = self._base(sub.ptr)
        uri, frag = urllib.parse.urldefrag(ref)
        if uri:
            absolute = urllib.parse.urldefrag(urllib.parse.urljoin(base, uri) if base else uri)[0]
            if absolute not in self._ids:
                raise GrammarError(f"remote $ref '{ref}' at {where} is not supported (refs are never fetched)")
            base, start = absolute, self._ids[absolute]
        frag = urllib.parse.unquote(frag)
        if frag == "" or frag.startswith("/"):
            target = start + frag
            node, ok = self._pointer(target)
            if not ok:
                raise GrammarError(f"$ref '{ref}' at {where} does not resolve")
        else:
            target = self._anchors.get((base, frag))
            if target is None:
                raise GrammarError(f"$ref '{ref}' at {where} does not resolve (no $anchor '{frag}')")
            node, _ = self._pointer(target)
        if target in sub.refs:
            raise RecursiveSchemaError(f"recursive schema: $ref cycle through #{target} with no object or "
                                       "array in between" if self.rules_mode else
                                       f"recursive schema (cycle through #{target}): needs the grammar path")
        return Subschema(node, target, sub.refs | {target})

    # ----------------------------------------------------------------------------- normalizing

    def _expand(self, sub: Subschema, out: list[Subschema], reasons: list[str]) -> bool:
        s = sub.schema
        if s is True:
            return True
        if s is False:
            reasons.append(f"false schema at {show_pointer(sub.ptr)}")
            return False
        if not isinstance(s, dict):
            raise GrammarError(f"schema at {show_pointer(sub.ptr)} must be an object or a boolean")
        if "$ref" in s and "$ref" not in sub.skip:
            if not self._expand(self._resolve(s["$ref"], sub), out, reasons):
                return False
        if "allOf" in s and "allOf" not in sub.skip:
            branches = s["allOf"]
            if not isinstance(branches, list) or not branches:
                raise GrammarError(f"allOf at {show_pointer(sub.ptr)} must be a non-empty array")
            for i, b in enumerate(branches):
                if not self._expand(Subschema(b, f"{sub.ptr}/allOf/{i}", sub.refs), out, reasons):
                    return False
        out.append(replace(sub, skip=sub.skip | {"$ref", "allOf"}))
        return True

    def normalize(self, conj: list[Subschema]):
        """conj -> MergedSchema, Alternatives, or None (unsatisfiable)."""
        flat: list[Subschema] = []
        reasons: list[str] = []
        for sub in conj:
            if not self._expand(sub, flat, reasons):
                self.unsat.append(f"schema at {show_pointer(conj[0].ptr)} is unsatisfiable ({reasons[0]})")
                return None
        finite = self._finite_by_evaluation(flat, conj[0].ptr if conj else "")
        if finite is not False:
            return finite
        for i, sub in enumerate(flat):
            for kw in ("anyOf", "oneOf"):
                if kw in sub.schema and kw not in sub.skip:
                    branches = sub.schema[kw]
                    if not isinstance(branches, list) or not branches:
                        raise GrammarError(f"{kw} at {show_pointer(sub.ptr)} must be a non-empty array")
                    base = list(flat)
                    base[i] = replace(sub, skip=sub.skip | {kw})
                    return Alternatives(kw, sub.ptr, [base + [Subschema(b, f"{sub.ptr}/{kw}/{j}", sub.refs)]
                                               for j, b in enumerate(branches)])
            rewritten = self._rewrite(flat, i, sub)
            if rewritten is not False:
                return rewritten
        return self._merge(flat, conj[0].ptr if conj else "")

    # ---- rewrites into anyOf: not, if/then/else, dependencies

    def negation(self) -> Negator:
        if self._negator is None:
            self._negator = Negator(self._resolve, self._synthesized)
        return self._negator

    def evaluation(self) -> Evaluator:
        if self._evaluator is None:
            self._evaluator = Evaluator(self._resolve)
        return self._evaluator

    def _synth(self, schema: dict, ptr: str, refs: frozenset) -> Subschema:
        self._synthesized.append(schema)
        return Subschema(schema, ptr, refs)

    def _rewrite(self, flat: list[Subschema], i: int, sub: Subschema):
        """not / if-then-else / dependencies of flat[i] as alternatives (an Alternatives), None if that
        leaves nothing, False if flat[i] has none of them."""
        s = sub.schema
        if not isinstance(s, dict):
            return False
        for kw in ("not", "if") + _DEPENDENCIES + _UNEVALUATED:
            if kw in s and kw not in sub.skip and (kw != "if" or "then" in s or "else" in s):
                break
        else:
            return False
        base = list(flat)
        base[i] = replace(sub, skip=sub.skip | {kw})
        conjs = self._rewrite_conjs(kw, s, sub)
        if conjs is None:
            self._keyword(kw, sub.ptr)  # strict: raises; lenient: dropped
            conjs = [[]]
        if not conjs:
            self.unsat.append(f"schema at {show_pointer(sub.ptr)} is unsatisfiable ('{kw}' excludes every value)")
            return None
        if len(conjs) > MAX_REWRITE_BRANCHES:
            raise GrammarError(f"'{kw}' at {show_pointer(sub.ptr)}: more than {MAX_REWRITE_BRANCHES} alternatives")
        if len(conjs) == 1:
            return self.normalize(base + conjs[0])
        return Alternatives("anyOf", sub.ptr, [base + c for c in conjs])

    def _rewrite_conjs(self, kw: str, s: dict, sub: Subschema) -> list[list[Subschema]] | None:
        p, refs = sub.ptr, sub.refs
        if kw in _UNEVALUATED:
            extra = self._unevaluated(kw, s[kw], sub)
            return None if extra is None else [[self._synth(extra, f"{p}/{kw}", refs)] if extra else []]
        if kw == "not":
            return self.negation().negate(Subschema(s["not"], f"{p}/not", refs))
        if kw == "if":
            cond = Subschema(s["if"], f"{p}/if", refs)
            neg = self.negation().negate(cond)
            if neg is None:
                return None
            then = [Subschema(s["then"], f"{p}/then", refs)] if "then" in s else []
            other = [Subschema(s["else"], f"{p}/else", refs)] if "else" in s else []
            return [[cond] + then] + [alt + other for alt in neg]
        deps = s[kw]
        if not isinstance(deps, dict):
            raise GrammarError(f"'{kw}' at {show_pointer(p)} must be an object")
        conjs: list[list[Subschema]] = [[]]
        for k, d in deps.items():
            where = f"{p}/{kw}/{pointer_token(k)}"
            absent = self._synth({FORBIDDEN_NAMES: [k]}, where, refs)
            if isinstance(d, list):
                present = [self._synth({"required": [k] + [x for x in d if x != k]}, where, refs)]
            else:
                present = [self._synth({"required": [k]}, where, refs), Subschema(d, where, refs)]
            conjs = [c + [absent] for c in conjs] + [c + present for c in conjs]
            if len(conjs) > MAX_REWRITE_BRANCHES:
                raise GrammarError(f"'{kw}' at {show_pointer(p)}: more than {MAX_REWRITE_BRANCHES} alternatives")
        return conjs

    # ---- unevaluatedProperties / unevaluatedItems, where what is evaluated is static

    def _unevaluated(self, kw: str, value, sub: Subschema) -> dict | None:
        """The schema that kw of sub amounts to ({} for none), or None where what is evaluated
        depends on which branches validate (an anyOf, oneOf, if, ... that evaluates some)."""
        arrays = kw == "unevaluatedItems"
        scope = _Evaluated()
        if not self._collect_evaluated(sub, arrays, scope, top=True):
            return None
        if value is True or scope.everything:
            return {}
        if arrays:
            if value is False:
                return {"maxItems": scope.num_items}
            return {"prefixItems": [True] * scope.num_items, "items": value} if scope.num_items else {"items": value}
        # what the scope evaluated, marked evaluated here too; the rest meets the value
        return {"properties": dict.fromkeys(sorted(scope.names), True),
                "patternProperties": dict.fromkeys(scope.patterns, True), "additionalProperties": value}

    def _collect_evaluated(self, sub: Subschema, arrays: bool, scope: "_Evaluated", top: bool = False) -> bool:
        """Add what sub.schema and its in-place applicators ($ref, allOf: _expand's walk) evaluate
        (properties, or items when arrays); False where that depends on validation outcomes."""
        flat: list[Subschema] = []
        try:
            if not self._expand(replace(sub, skip=frozenset()), flat, []):
                return True  # a false schema in scope: nothing validates, nothing to evaluate
        except GrammarError:
            return False
        for part in flat:
            schema, ptr = part.schema, part.ptr
            if not isinstance(schema, dict):
                continue
            if "$dynamicRef" in schema or "$recursiveRef" in schema:
                return False
            nested = not top or part.schema is not sub.schema
            if arrays:
                if "contains" in schema:
                    return False  # contains evaluates the items it matches
                if isinstance(schema.get("prefixItems"), list):
                    scope.num_items = max(scope.num_items, len(schema["prefixItems"]))
                scope.everything |= "items" in schema or (nested and "unevaluatedItems" in schema)
            else:
                scope.names |= set(schema.get("properties") or ())
                scope.patterns += [pat for pat in schema.get("patternProperties") or () if pat not in scope.patterns]
                # a nested unevaluatedProperties evaluates everything left in its own scope
                scope.everything |= "additionalProperties" in schema or (nested and "unevaluatedProperties" in schema)
            dynamic = [(b, f"{ptr}/{kw}/{i}") for kw in ("anyOf", "oneOf") for i, b in enumerate(schema.get(kw) or ())]
            dynamic += [(schema[kw], f"{ptr}/{kw}") for kw in ("if", "then", "else") if kw in schema]
            dynamic += [(b, f"{ptr}/dependentSchemas/{pointer_token(k)}")
                        for k, b in (schema.get("dependentSchemas") or {}).items()]
            for branch, where in dynamic:
                probe = _Evaluated()
                branch_sub = Subschema(branch, where, part.refs)
                if not self._collect_evaluated(branch_sub, arrays, probe) or probe.evaluates_any():
                    return False
        return True

    def _finite_by_evaluation(self, flat: list[Subschema], ptr: str):
        """Where an enum/const lists the candidates, every keyword (not, oneOf, multipleOf, ...)
        is applied by evaluating each candidate exactly: a MergedSchema of the survivors, None if none
        survives, False where some candidate can't be decided (the keyword path takes over)."""
        cands = next(([s.schema["const"]] if "const" in s.schema else s.schema["enum"]
                      for s in flat if isinstance(s.schema, dict)
                      and ("const" in s.schema or isinstance(s.schema.get("enum"), list))), None)
        if cands is None:
            return False
        kept = []
        for v in cands:
            ok = self.evaluation().decide(flat, v)
            if ok is None:
                return False
            if ok:
                kept.append(v)
        kept = unique_json(kept)
        if not kept:
            what = "allOf" if any("/allOf/" in s.ptr[len(ptr):] for s in flat) else "schema"
            self.unsat.append(f"{what} at {show_pointer(ptr)} is unsatisfiable (no enum/const value passes "
                              "the other keywords)")
            return None
        return MergedSchema(ptr, enum=kept, types=_declared_types(flat))

    def _merge(self, flat: list[Subschema], ptr: str):
        """Every keyword of flat merged into one MergedSchema, in flat's order (the first invalid
        keyword is the one reported); None if the merge admits no value."""
        n = MergedSchema(ptr)
        n.from_allof = any("/allOf/" in s.ptr[len(ptr):] for s in flat)
        obj_parts, arr_parts = [], []
        for sub in flat:
            self._merge_in_key_order(n, sub)
            _merge_private(n, sub)
            _merge_type_enum(n, sub.schema, sub.ptr)
            _merge_bounds(n, sub.schema, sub.ptr)
            _merge_string(n, sub.schema, sub.ptr)
            obj_parts += _merge_object(n, sub)
            arr_parts += _merge_array(n, sub)
        # properties of one part meet the additionalProperties of the others
        if obj_parts:
            self._merge_properties(n, obj_parts)
        if arr_parts:
            _merge_items(n, arr_parts)
        return self._satisfiable(n, "allOf" if n.from_allof else "schema")

    def _merge_in_key_order(self, n: MergedSchema, sub: Subschema) -> None:
        """multipleOf, and the keywords left for a rewrite that did not happen, in key order."""
        s, p = sub.schema, sub.ptr
        for kw in s:
            if kw == "multipleOf" and _is_one(s[kw]):  # integral numbers: integer
                n.types = (set(INSTANCE_TYPES) if n.types is None else n.types) - {"fraction"}
            elif kw == "multipleOf":
                n.multiple_of.append((_positive_number(s[kw], f"{p}/multipleOf"), p))
            elif kw in _UNSUPPORTED and kw not in sub.skip:
                self._keyword(kw, p)
        if "if" in s and ("then" in s or "else" in s) and "if" not in sub.skip:
            self._keyword("if", p)

    def _satisfiable(self, n: MergedSchema, what: str) -> MergedSchema | None:
        """n, its excluded values taken out of its enum; None if no type or no value is left."""
        if n.types is not None and not n.types:
            self.unsat.append(f"{what} at {show_pointer(n.ptr)} is unsatisfiable (no type is allowed by all parts)")
            return None
        if n.enum is not None and n.excluded:
            excluded = set(map(json_key, n.excluded))
            n.enum = [v for v in n.enum if json_key(v) not in excluded]
            n.excluded = []
        if n.enum is not None and not n.enum:
            self.unsat.append(f"{what} at {show_pointer(n.ptr)} is unsatisfiable (no value is in every enum/const)")
            return None
        return n

    def _merge_properties(self, n: MergedSchema, parts: list) -> None:
        """properties, patternProperties and additionalProperties of the parts (sub, props, ap,
        pats): a declared name takes its properties, every pattern that matches it, and where
        neither applies the part's additionalProperties."""
        names: list[str] = []
        for _, props, _, _ in parts:
            names += [k for k in props if k not in names]
        with_pats = [part for part in parts if part[3]]
        if with_pats:
            names += [r for r in n.required if r not in names]
        for k in names:
            conj = []
            for sub, props, ap, pats in parts:
                hits = self._matching_patterns(pats, k)
                if k in props:
                    conj.append(Subschema(props[k], f"{sub.ptr}/properties/{pointer_token(k)}", sub.refs))
                conj += hits
                if k not in props and not hits and ap is not None:
                    conj.append(ap)
            if conj or k not in n.required:
                n.props[k] = conj
        if len(with_pats) > 1:
            self.unsupported("patternProperties", with_pats[1][0].ptr, "in more than one allOf branch")
            with_pats = with_pats[:1]
        for sub, _, _, pats in with_pats:
            others = [ap for s2, _, ap, _ in parts if s2 is not sub and ap is not None]
            n.pattern_props = [(q, x.ptr, [x] + others) for q, x in pats.items()]
        aps = [ap for _, _, ap, _ in parts if ap is not None]
        n.additional = aps or None

    def _matching_patterns(self, pats: dict, name: str) -> list[Subschema]:
        hits = []
        for q, x in pats.items():
            r = pattern_test(q, name)
            if r is None:
                self.unsupported("patternProperties", x.ptr, f"can't decide whether {q!r} matches {name!r}")
            elif r:
                hits.append(x)
        return hits

    # ---- disjointness (for oneOf and tuple uniqueness), in JSON Schema semantics

    def _pairwise_disjoint(self, conjs: list[list[Subschema]]) -> bool:
        nodes = [self._peek(c) for c in conjs]
        return all(self._disjoint_conjs(nodes, conjs, i, j)
                   for i in range(len(nodes)) for j in range(i + 1, len(nodes)))

    def _disjoint_conjs(self, nodes: list, conjs: list[list[Subschema]], i: int, j: int) -> bool:
        if self._disjoint(nodes[i], nodes[j], 2):
            return True
        return self._enum_outside(nodes[i], conjs[j]) or self._enum_outside(nodes[j], conjs[i])

    def _enum_outside(self, node, conj: list[Subschema]) -> bool:
        """node's enum values all fail conj (evaluated exactly)."""
        if not isinstance(node, MergedSchema) or node.enum is None:
            return False
        return all(self.evaluation().decide(conj, v) is False for v in node.enum)

    def exclusive_branches(self, alts: Alternatives) -> tuple[list[list[list[Subschema]]], bool] | None:
        """oneOf as anyOf of exclusive alternatives: branch i and not every branch j that may
        overlap it (oneOf(A, B) = A and not B, or B and not A). Returns per branch its
        alternatives, and whether some negation was partial (a subset: narrowed); None if a
        negation is out of reach. Each conj is the shared siblings followed by its branch."""
        nodes = [self._peek(c) for c in alts.conjs]
        out: list[list[list[Subschema]]] = []
        partial = False
        for i, conj in enumerate(alts.conjs):
            mine = [conj]
            for j, other in enumerate(alts.conjs):
                if j == i or self._disjoint_conjs(nodes, alts.conjs, i, j):
                    continue
                neg = self.negation().negate(other[-1], partial=True)
                if neg is None:
                    return None
                partial = partial or self.negation().dropped
                mine = [m + alt for m in mine for alt in neg]
                if sum(map(len, out)) + len(mine) > MAX_REWRITE_BRANCHES:
                    return None
            out.append(mine)
        return out, partial

    def _peek(self, conj):
        """The normalized node of conj for disjointness checks (None if unsatisfiable, an Alternatives
        as is); errors are left for compile() to raise."""
        saved = list(self.unsat)
        try:
            return self.normalize(conj)
        except GrammarError:
            return "unknown"
        finally:
            self.unsat = saved

    def _disjoint(self, a, b, depth: int) -> bool:
        if a is None or b is None:
            return True
        for x, y in ((a, b), (b, a)):
            if isinstance(x, Alternatives) and depth > 0:  # every alternative of x is disjoint from y
                return all(self._disjoint(self._peek(c), y, depth - 1) for c in x.conjs)
        if not isinstance(a, MergedSchema) or not isinstance(b, MergedSchema):
            return False
        ta = _effective_types(a)
        tb = _effective_types(b)
        common = ta & tb
        if not common:
            return True
        if a.enum is not None and b.enum is not None:
            return not set(map(json_key, a.enum)) & set(map(json_key, b.enum))
        if common <= {"integer", "fraction"}:
            return _ranges_disjoint(a, b)
        if common == {"string"} and _patterns_disjoint(a, b):
            return True
        if common == {"object"} and (a.forbidden & set(b.required) or b.forbidden & set(a.required)):
            return True
        if common == {"object"} and depth > 0:
            for x, y in ((a, b), (b, a)):
                if _closed(x) and any(r not in x.props for r in y.required):
                    return True
            for k in a.required:
                if k in b.required and k in a.props and k in b.props:
                    if self._disjoint(self._peek(a.props[k]), self._peek(b.props[k]), depth - 1):
                        return True
        return False


def _merge_private(n: MergedSchema, sub: Subschema) -> None:
    """The private keywords of synthesized schemas (json.schema_neg)."""
    s = sub.schema
    if FORBIDDEN_NAMES in s:
        n.forbidden |= set(s[FORBIDDEN_NAMES])
    if EXCLUDED_VALUES in s:
        n.excluded = unique_json(n.excluded + list(s[EXCLUDED_VALUES]))
    if "$ref" in s and "$ref" not in sub.skip:  # pragma: no cover - expanded before
        raise AssertionError


def _declared_types(flat: list[Subschema]) -> set | None:
    """The instance types every `type` among the subschemas allows (None: no `type`): an enum's
    writer spells integral values without a fraction where "fraction" is not among them."""
    types = None
    for sub in flat:
        ts = _types_named(sub.schema.get("type")) if isinstance(sub.schema, dict) else None
        if ts is not None:
            types = ts if types is None else types & ts
    return types


def _types_named(t) -> set | None:
    """The instance types a `type` value names; None where it is no valid `type`."""
    names = [t] if isinstance(t, str) else t
    if not isinstance(names, list) or not names or any(x not in TYPES_OF_NAME for x in names):
        return None
    return set().union(*(TYPES_OF_NAME[x] for x in names))


def _merge_type_enum(n: MergedSchema, s: dict, p: str) -> None:
    if "type" in s:
        ts = _types_named(s["type"])
        if ts is None:
            raise GrammarError(f"invalid 'type' at {show_pointer(p)}: {s['type']!r}")
        n.types = ts if n.types is None else n.types & ts
    for kw in ("enum", "const"):
        if kw not in s:
            continue
        vals = [s["const"]] if kw == "const" else s["enum"]
        if not isinstance(vals, list):
            raise GrammarError(f"'enum' at {show_pointer(p)} must be an array")
        if n.enum is None:
            n.enum = unique_json(vals)
        else:
            keys = set(map(json_key, vals))
            n.enum = [v for v in n.enum if json_key(v) in keys]


def _merge_bounds(n: MergedSchema, s: dict, p: str) -> None:
    for side in ("minimum", "maximum"):
        ex_kw = "exclusiveMinimum" if side == "minimum" else "exclusiveMaximum"
        cands = []
        if side in s:
            ex = s.get(ex_kw) is True  # draft 4
            cands.append((Bound(_to_decimal(s[side], side, p), ex), ex_kw if ex else side, s[side]))
        if ex_kw in s and not isinstance(s[ex_kw], bool):
            cands.append((Bound(_to_decimal(s[ex_kw], ex_kw, p), True), ex_kw, s[ex_kw]))
        for b, kw, raw in cands:
            if side == "minimum":
                cur = n.lo
                if cur is None or b.value > cur.value or (b.value == cur.value and b.exclusive):
                    n.lo, n.lo_src = b, (kw, p, raw)
            else:
                cur = n.hi
                if cur is None or b.value < cur.value or (b.value == cur.value and b.exclusive):
                    n.hi, n.hi_src = b, (kw, p, raw)


def _merge_string(n: MergedSchema, s: dict, p: str) -> None:
    if "minLength" in s:
        n.min_len = max(n.min_len, _to_count(s["minLength"], "minLength", p))
    if "maxLength" in s:
        m = _to_count(s["maxLength"], "maxLength", p)
        n.max_len = m if n.max_len is None else min(n.max_len, m)
    for kw, merged in (("pattern", n.patterns), ("format", n.formats)):
        if kw in s:
            if not isinstance(s[kw], str):
                raise GrammarError(f"'{kw}' at {show_pointer(p)} must be a string")
            if all(s[kw] != q for q, _ in merged):
                merged.append((s[kw], p))


def _merge_object(n: MergedSchema, sub: Subschema) -> list[tuple]:
    """The object keywords of sub merged into n, but for its properties: returned as a part
    (sub, properties, additionalProperties, patternProperties) for Normalizer._merge_properties."""
    s, p = sub.schema, sub.ptr
    parts = []
    if "properties" in s or "additionalProperties" in s or "patternProperties" in s:
        props = s.get("properties", {})
        pats = s.get("patternProperties", {})
        for kw, x in (("properties", props), ("patternProperties", pats)):
            if not isinstance(x, dict):
                raise GrammarError(f"'{kw}' at {show_pointer(p)} must be an object")
        ap = s.get("additionalProperties")
        parts.append((sub, props, None if ap is None else Subschema(ap, f"{p}/additionalProperties", sub.refs),
                      {q: Subschema(x, f"{p}/patternProperties/{pointer_token(q)}", sub.refs)
                       for q, x in pats.items()}))
    if "required" in s:
        req = s["required"]
        if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
            raise GrammarError(f"'required' at {show_pointer(p)} must be an array of strings")
        for r in req:
            if r not in n.required:
                n.required.append(r)
    if "propertyNames" in s:
        n.prop_names = (n.prop_names or []) + [Subschema(s["propertyNames"], f"{p}/propertyNames", sub.refs)]
    if "minProperties" in s:
        v = _to_count(s["minProperties"], "minProperties", p)
        if v > n.min_props:
            n.min_props, n.min_props_ptr = v, p
    if "maxProperties" in s:
        v = _to_count(s["maxProperties"], "maxProperties", p)
        if n.max_props is None or v < n.max_props:
            n.max_props, n.max_props_ptr = v, p
    return parts


def _merge_array(n: MergedSchema, sub: Subschema) -> list[tuple]:
    """The array keywords of sub merged into n, but for its items: returned as a part
    (prefix subschemas, the rest's subschema or None) for _merge_items."""
    s, p = sub.schema, sub.ptr
    parts = []
    items = s.get("items")
    if isinstance(items, list):  # draft 2019 and older: tuple form
        pre = [Subschema(x, f"{p}/items/{i}", sub.refs) for i, x in enumerate(items)]
        rest = s.get("additionalItems")
        parts.append((pre, None if rest is None else Subschema(rest, f"{p}/additionalItems", sub.refs)))
    elif "prefixItems" in s or "items" in s:
        pi = s.get("prefixItems", [])
        if not isinstance(pi, list):
            raise GrammarError(f"'prefixItems' at {show_pointer(p)} must be an array")
        pre = [Subschema(x, f"{p}/prefixItems/{i}", sub.refs) for i, x in enumerate(pi)]
        parts.append((pre, None if items is None else Subschema(items, f"{p}/items", sub.refs)))
    if "minItems" in s:
        n.min_items = max(n.min_items, _to_count(s["minItems"], "minItems", p))
    if "maxItems" in s:
        m = _to_count(s["maxItems"], "maxItems", p)
        n.max_items = m if n.max_items is None else min(n.max_items, m)
    if s.get("uniqueItems") is True and n.unique is None:
        n.unique = p
    if "contains" in s:
        hi = s.get("maxContains")
        n.contains.append((Subschema(s["contains"], f"{p}/contains", sub.refs),
                           _to_count(s.get("minContains", 1), "minContains", p),
                           None if hi is None else _to_count(hi, "maxContains", p)))
    return parts


def _merge_items(n: MergedSchema, parts: list[tuple]) -> None:
    """Position i of the array takes every part's prefix schema i, or that part's rest schema."""
    width = max(len(pre) for pre, _ in parts)
    for i in range(width):
        n.prefix.append([pre[i] if i < len(pre) else rest
                         for pre, rest in parts if i < len(pre) or rest is not None])
    rests = [rest for _, rest in parts if rest is not None]
    n.items = rests or None


def _positive_number(v, ptr: str) -> Decimal:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
        raise GrammarError(f"{ptr} must be a number greater than 0, got {json.dumps(v)}")
    return Decimal(str(v))


def _is_one(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == 1


def _closed(n: MergedSchema) -> bool:
    """additionalProperties: false and no patternProperties (in JSON Schema semantics)."""
    return not n.pattern_props and n.additional is not None and any(s.schema is False for s in n.additional)


def _effective_types(n: MergedSchema) -> set:
    t = set(n.types) if n.types is not None else set(INSTANCE_TYPES)
    if n.enum is not None:
        t &= set().union(*(instance_types(v) for v in n.enum)) if n.enum else set()
    return t


def _ranges_disjoint(a: MergedSchema, b: MergedSchema) -> bool:
    def below(hi: Bound | None, lo: Bound | None) -> bool:  # everything <= hi is < lo
        if hi is None or lo is None:
            return False
        return hi.value < lo.value or (hi.value == lo.value and (hi.exclusive or lo.exclusive))

    return below(a.hi, b.lo) or below(b.hi, a.lo)


def _patterns_disjoint(a: MergedSchema, b: MergedSchema) -> bool:
    """Some pattern of a and some pattern of b match no common string (first characters differ)."""

    def specs(n: MergedSchema) -> list:
        out = []
        for q, _ in n.patterns:
            try:
                out.append(StringSpec.from_pattern(q))
            except GrammarError:
                pass
        return out
    return any(provably_disjoint(x, y) for x in specs(a) for y in specs(b))
