"""JSON Schema → regex for the keywords compiled by evaluation and rewriting: enum/const filtered
through every sibling (not, oneOf, multipleOf, ...), not, oneOf made exclusive, if/then/else,
dependencies, patternProperties, and formats outside the JSON Schema vocabularies. Each case
checks the regex against jsonschema on valid and invalid instances, in several serializations."""

import json
import re

import jsonschema
import pytest

from gdserve.grammar import compile_grammar
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.schema import compile_json_schema, schema_to_regex


def serializations(x):
    return [json.dumps(x), json.dumps(x, indent=2), json.dumps(x, separators=(",", ":"))]


def assert_exact(schema, valid, invalid):
    """Every listed instance: the regex agrees with jsonschema (the lists are checked too)."""
    rx = re.compile(schema_to_regex(schema)[0])
    v = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    for x in valid:
        assert v.is_valid(x), x
        for s in serializations(x):
            assert rx.fullmatch(s), s
    for x in invalid:
        assert not v.is_valid(x), x
        for s in serializations(x):
            assert not rx.fullmatch(s), s


# ---- multipleOf

@pytest.mark.parametrize("schema,valid,invalid", [
    ({"type": "integer", "minimum": -2032, "maximum": 2031, "multipleOf": 16}, [-2032, 0, 16, 2016],
     [-2048, 8, 2031, 2032, 1.5]),
    ({"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 100}, [0, 0.5, 99.75, 100, 3.0],
     [-0.25, 0.1, 100.25, 7.3]),
    ({"type": "number", "multipleOf": 0.01}, [0, -3.14, 12, 0.5, 1e6], [0.001, -3.141]),
    ({"type": "integer", "multipleOf": 2.5}, [0, 5, -10, 12345670], [2, 7, 2.5]),
    ({"type": "integer", "multipleOf": 25, "exclusiveMinimum": 30}, [50, 75, 100, 1000025], [25, 30, 60, 0]),
    ({"allOf": [{"multipleOf": 4}, {"multipleOf": 10}], "type": "integer", "minimum": 0}, [0, 20, 140, 1000],
     [4, 10, 30, -20]),
    ({"type": "integer", "multipleOf": 3, "minimum": 1, "maximum": 999}, [3, 999, 501], [0, 1, 1000, 502]),
    ({"type": ["number", "null"], "multipleOf": 0.5}, [None, 1.5, -2], [0.25, "1"]),
])
def test_multiple_of(schema, valid, invalid):
    assert_exact(schema, valid, invalid)


def test_multiple_of_refused_clearly():
    with pytest.raises(GrammarError, match=r"unsupported multipleOf at / \(more than 1000 multiples of 1.5"):
        schema_to_regex({"type": "number", "multipleOf": 1.5})
    for bad in (0, -2, "2", True):
        with pytest.raises(GrammarError, match="multipleOf must be a number greater than 0"):
            schema_to_regex({"type": "integer", "multipleOf": bad})


# ---- enum/const evaluated through every sibling keyword

def test_enum_filtered_by_keywords_the_compiler_lacks():
    assert_exact({"enum": [1, 2, 3, 4, 6], "multipleOf": 2, "not": {"const": 4}}, [2, 6], [1, 3, 4, 5])
    assert_exact({"allOf": [{"enum": [[1], [True], {"a": 1}]}, {"not": {"enum": [[True]]}}]},
                 [[1], {"a": 1}], [[True]])
    assert_exact({"enum": ["a", "b", 3], "oneOf": [{"type": "string"}, {"const": "b"}]}, ["a"], ["b", 3])
    assert_exact({"enum": [{"a": 1}, {"a": "x"}], "if": {"properties": {"a": {"type": "integer"}}},
                  "then": {"properties": {"a": {"minimum": 2}}}}, [{"a": "x"}], [{"a": 1}])
    with pytest.raises(GrammarError, match="unsatisfiable"):
        schema_to_regex({"const": 3, "not": {"type": "integer"}})
    # thousands of values: repeats (1 and 1.0, not true) and exclusions found by key, not pairwise
    assert_exact({"enum": [*range(2000), 1.0, True, [1, {"a": 2}], [1.0, {"a": 2.0}]],
                  "not": {"enum": [*range(0, 2000, 2), [1, {"a": 2}]]}},
                 [1, 1999, True, 1.0], [0, 1998, False, 2000, [1, {"a": 2}]])


def test_enum_evaluation_falls_back_when_undecidable():
    # a format our pattern only partly covers can't reject a value: the keyword path takes over
    r = compile_json_schema({"enum": ["a@b.co", "x"], "format": "email"})
    rx = re.compile(r.regex)
    assert rx.fullmatch('"a@b.co"') and not rx.fullmatch('"x"')


# ---- not

def test_not_of_types_values_and_required():
    assert_exact({"not": {"type": ["string", "null"]}}, [1, 2.5, True, [], {}], ["a", None])
    assert_exact({"type": "string", "not": {"enum": ["a", "b"]}}, ["c", "ab", ""], ["a", "b", 1])
    assert_exact({"type": ["boolean", "null"], "not": {"const": False}}, [True, None], [False])
    assert_exact({"type": "object", "properties": {"a": {}, "b": {}}, "not": {"required": ["a", "b"]}},
                 [{"a": 1}, {"b": 1}, {}], [{"a": 1, "b": 2}])
    assert_exact({"type": "object", "not": {"required": ["x"]}}, [{}, {"y": 1}], [{"x": 1}, {"y": 1, "x": 2}])
    assert_exact({"type": "string", "not": {"maxLength": 2}}, ["abc"], ["", "ab"])
    assert_exact({"type": "integer", "not": {"minimum": 3}}, [2, -7], [3, 40])
    assert_exact({"not": {"not": {"type": "integer", "maximum": 3}}}, [3, -1], [4, "a", None])
    # excluded numbers cut the range (exclusive bounds at each)
    assert_exact({"type": "integer", "not": {"const": 3}}, [2, 4, -3, 30], [3])
    assert_exact({"type": "integer", "minimum": 0, "maximum": 3, "not": {"enum": [1, 2, 9]}}, [0, 3], [1, 2, 4])
    assert_exact({"type": "number", "not": {"const": 0.5}}, [0.25, 1, 0.51, -0.5], [0.5])
    assert_exact({"not": {"const": 1}}, [2, 1.5, "1", None, [1]], [1])


def test_not_without_a_positive_form_is_refused_or_relaxed():
    for schema in [{"type": "string", "not": {"pattern": "^a"}}, {"not": {"type": "integer"}},
                   {"type": "array", "not": {"const": [1]}}]:
        with pytest.raises(GrammarError, match="not"):
            schema_to_regex(schema)
    regex, relaxed = schema_to_regex({"type": "string", "not": {"pattern": "^a"}}, lenient=True)
    assert "not at /" in relaxed and re.fullmatch(regex, '"abc"')


def test_contains_min_and_max():
    assert_exact({"type": "array", "contains": {"minimum": 5}},
                 [[5], [1, "a"], [9, 9]], [[], [1, 2], [4.9]])
    assert_exact({"type": "array", "contains": {"const": 1}, "minContains": 2, "maxContains": 3},
                 [[1, 1], [1, 2, 1], [2, 1, 1, 1, 2]], [[1], [1, 1, 1, 1], [], [2, 2]])
    assert_exact({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "maxContains": 1,
                  "minContains": 0}, [[], [2, 3], [1, 2]], [[1, 1], ["a"], [1, 2, 1]])
    assert_exact({"type": "array", "contains": {"const": 1}, "maxContains": 0, "minContains": 0},
                 [[], [2]], [[1]])
    with pytest.raises(GrammarError, match="unsatisfiable"):
        schema_to_regex({"type": "array", "contains": {"const": 1}, "minContains": 3, "maxContains": 2})
    with pytest.raises(GrammarError, match="contains"):  # counted items within a total: not yet
        schema_to_regex({"type": "array", "contains": {"const": 1}, "minItems": 2})


def test_unevaluated_properties_and_items_where_static():
    assert_exact({"type": "object", "allOf": [{"properties": {"a": {}}}], "properties": {"b": {}},
                  "unevaluatedProperties": False}, [{"a": 1, "b": 2}, {}], [{"c": 1}, {"a": 1, "c": 1}])
    with pytest.raises(GrammarError, match="patternProperties"):  # patterns in two places: not yet
        schema_to_regex({"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False})
    # a nested one only sees its own scope: a cousin's properties are not evaluated for it
    assert_exact({"type": "object", "properties": {"b": {}},
                  "allOf": [{"properties": {"a": {}}, "unevaluatedProperties": False}]},
                 [{"a": 1}, {}], [{"a": 1, "b": 2}, {"b": 1}])
    assert_exact({"type": "object", "additionalProperties": True, "unevaluatedProperties": False},
                 [{"z": 1}], [])
    assert_exact({"type": "object", "unevaluatedProperties": {"type": "integer"}}, [{"a": 1}, {}], [{"a": "x"}])
    assert_exact({"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False},
                 [["a"], []], [["a", 1]])
    assert_exact({"type": "array", "allOf": [{"prefixItems": [{}, {}]}], "unevaluatedItems": {"type": "string"}},
                 [[1, 2, "c"], [1]], [[1, 2, 3]])
    # evaluation that depends on which branch validates is refused, never guessed
    with pytest.raises(GrammarError, match="unevaluatedProperties"):
        schema_to_regex({"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
                         "unevaluatedProperties": False})
    with pytest.raises(GrammarError, match="unevaluatedItems"):
        schema_to_regex({"contains": {"const": 1}, "unevaluatedItems": False})


def test_not_anything_is_unsatisfiable():
    with pytest.raises(GrammarError, match="unsatisfiable"):
        schema_to_regex({"type": "string", "not": {}})


# ---- oneOf made exclusive

def test_one_of_overlapping_branches_made_exclusive():
    area = {"type": "object", "properties": {"radius": {"type": "number"}, "length": {"type": "number"},
                                             "width": {"type": "number"}},
            "oneOf": [{"required": ["radius"]}, {"required": ["length", "width"]}]}
    assert_exact(area, [{"radius": 1}, {"length": 1, "width": 2}, {"radius": 1, "length": 3}],
                 [{"radius": 1, "length": 1, "width": 2}, {}, {"length": 1}])
    assert_exact({"oneOf": [{"enum": ["linux"]}, {"type": "string"}]}, ["osx", ""], ["linux", 1])
    assert_exact({"oneOf": [{"type": "string", "pattern": "^https?://"}, {"type": "string", "pattern": "^\\./"}]},
                 ["http://x", "./a"], ["x", 1])
    assert_exact({"oneOf": [{"type": "string", "pattern": "^[0-9a-f]{24}$"}, {"enum": [""]}, {"type": "null"}]},
                 ["0123456789abcdef01234567", "", None], ["x"])


def test_one_of_discriminator_not_required():
    schema = {"type": "object", "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}},
              "oneOf": [{"properties": {"kind": {"enum": ["a"]}}}, {"properties": {"kind": {"enum": ["b"]}}}]}
    # without "kind" both branches hold, so exactly-one fails
    assert_exact(schema, [{"kind": "a"}, {"kind": "b", "n": 1}], [{}, {"n": 1}, {"kind": "c"}])


def test_one_of_narrowed_when_a_negation_is_partial():
    schema = {"type": "array", "items": {"type": "object"}, "oneOf": [
        {"items": {"properties": {"error": {"type": "string"}}, "required": ["error"]}},
        {"items": {"properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}]}
    with pytest.raises(GrammarError, match="oneOf"):
        schema_to_regex(schema)  # both hold for [], and "not items" has no positive form
    objects = {"oneOf": [{"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
                         {"type": "object", "properties": {"ok": {"type": "string", "pattern": "^y"}},
                          "required": ["ok"]}]}
    r = compile_json_schema(objects)  # "not pattern" has no positive form: narrowed, still sound
    assert any("oneOf" in x for x in r.narrowed)
    assert_exact(objects, [{"error": "x"}, {"ok": "yes"}], [{"error": "x", "ok": "yes"}, {}, {"ok": "no"}])


# ---- if/then/else, dependencies

def test_if_then_else():
    schema = {"type": "object", "properties": {"kind": {"type": "string"}, "v": {"type": "integer"}},
              "if": {"properties": {"kind": {"const": "x"}}, "required": ["kind"]},
              "then": {"required": ["v"]}, "else": {"not": {"required": ["v"]}}}
    assert_exact(schema, [{"kind": "x", "v": 1}, {"kind": "y"}, {}], [{"kind": "x"}, {"kind": "y", "v": 2}, {"v": 1}])
    assert_exact({"type": "integer", "if": {"minimum": 10}, "then": {"maximum": 20}, "else": {"minimum": 0}},
                 [0, 9, 10, 20], [-1, 21])


def test_dependencies_all_forms():
    props = {"a": {}, "b": {}, "c": {"type": "integer"}}
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#"}  # where "dependencies" lives
    for kw, extra in (("dependentRequired", {}), ("dependencies", draft7)):
        assert_exact({**extra, "type": "object", "properties": props, kw: {"a": ["b"]}},
                     [{}, {"b": 1}, {"a": 1, "b": 2}], [{"a": 1}, {"a": 1, "c": 3}])
    for kw, extra in (("dependentSchemas", {}), ("dependencies", draft7)):
        assert_exact({**extra, "type": "object", "properties": props, kw: {"a": {"required": ["c"]}}},
                     [{}, {"a": 1, "c": 2}, {"c": 1}], [{"a": 1}, {"a": 1, "c": "x"}])


# ---- patternProperties

def test_pattern_properties_maps_and_declared_names():
    assert_exact({"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}},
                  "additionalProperties": False},
                 [{}, {"ab": 1, "c": 2}], [{"ab": "x"}, {"A": 1}, {"a1": 1}])
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False}
    assert_exact(schema, [{"name": "a"}, {"name": "a", "x-y": "b"}, {"x-1": "q", "x-2": "r"}],
                 [{"x-1": 2}, {"other": 1}, {"name": 1}])
    assert_exact({"type": "object", "properties": {"a": {"type": "integer"}},
                  "patternProperties": {".*": {"minimum": 0}}},
                 [{"a": 1}, {"a": 0, "b": 3}], [{"a": -1}, {"b": -3}, {"a": "x"}])
    # a pattern that takes every key applies to the declared names too
    assert_exact({"type": "object", "properties": {"ab": {"type": "integer"}},
                  "patternProperties": {".*": {"minimum": 5}}, "additionalProperties": False},
                 [{"ab": 5}, {"ab": 6, "ac": 7}], [{"ab": 1}, {"ac": 1}])


def test_pattern_properties_narrowing_and_refusals():
    r = compile_json_schema({"type": "object", "patternProperties": {"^x-": {}},
                             "additionalProperties": {"type": "integer"}})
    assert r.narrowed and re.fullmatch(r.regex, '{"x-a": "s"}') and not re.fullmatch(r.regex, '{"b": 1}')
    with pytest.raises(GrammarError, match="patternProperties"):
        schema_to_regex({"type": "object", "patternProperties": {"^a": {"type": "integer"}, "b$": {"type": "string"}}})
    with pytest.raises(GrammarError, match="patternProperties"):  # "ab" is declared and matched by "^a"
        schema_to_regex({"type": "object", "properties": {"ab": {"minimum": 3}},
                         "patternProperties": {"^a": {"type": "integer"}}, "additionalProperties": False})
    # ... unless "ab" asks nothing more than the pattern does
    assert_exact({"type": "object", "properties": {"ab": {"title": "AB"}},
                  "patternProperties": {"^a": {"type": "integer"}}, "additionalProperties": False},
                 [{"ab": 1}, {"ac": 2, "ab": 3}], [{"ab": "x"}, {"b": 1}])


def test_pattern_properties_one_of_is_not_closed():
    # additionalProperties: false with patternProperties still admits pattern keys: not disjoint
    schema = {"oneOf": [{"type": "object", "patternProperties": {"^k": {}}, "additionalProperties": False},
                        {"type": "object", "required": ["k1"]}]}
    r = compile_json_schema(schema, lenient=True)
    rx = re.compile(r.regex)
    v = jsonschema.Draft202012Validator(schema)
    for x in [{"k1": 1}, {}, {"a": 1}]:
        if rx.fullmatch(json.dumps(x)):
            assert v.is_valid(x) or any("oneOf" in y for y in r.relaxed), x


# ---- formats

def test_formats_outside_the_vocabularies_are_annotations():
    r = compile_json_schema({"type": "string", "format": "semver"})
    assert re.fullmatch(r.regex, '"anything"') and any("semver" in x for x in r.relaxed)
    with pytest.raises(GrammarError, match="format 'idn-hostname'"):
        schema_to_regex({"type": "string", "format": "idn-hostname"})


# ---- through the token index

def test_compiled_through_compile_grammar(smollm2_tokenizer):
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
              "patternProperties": {"^x-": {"type": "boolean"}}, "additionalProperties": False,
              "dependentRequired": {"n": ["kind"]}, "not": {"required": ["zz"]}}
    g = compile_grammar("json", schema, smollm2_tokenizer)

    def accepts(text: str) -> bool:
        m = g.matcher()
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        return all(m.accept_token(t) for t in ids) and m.accept_token(smollm2_tokenizer.eos_token_id)

    assert accepts('{"kind": "a", "n": 1, "x-y": true}') and accepts('{"x-q": false}')
    assert not accepts('{"n": 1}') and not accepts('{"x-y": 1}') and not accepts('{"kind": "c"}')


def test_pattern_properties_matching_a_declared_name_with_the_same_schema():
    schema = {"type": "object", "required": ["FN"], "additionalProperties": False,
              "properties": {"FN": {"type": "string"}, "X-twitter": {"type": "string", "title": "T"}},
              "patternProperties": {"^X-": {"type": "string"}}}
    assert_exact(schema, [{"FN": "a"}, {"FN": "a", "X-twitter": "t", "X-gh": "g"}, {"FN": "a", "X-q": "r"}],
                 [{"FN": "a", "X-twitter": 1}, {"FN": "a", "X-gh": 2}, {"X-a": "b"}])
    patterns = {"type": "object", "patternProperties": {"^displayName:(en|nl)$": {"type": "string"},
                                                        "^description:(en|nl)$": {"type": "integer"}}}
    assert_exact(patterns, [{"displayName:en": "x", "description:nl": 3}], [{"displayName:en": 3}])


def test_pattern_disjointness_and_match_everything():
    from gdserve.grammar.json.patterns import StringSpec, matches_everything, provably_disjoint
    spec = StringSpec.from_pattern
    assert provably_disjoint(spec("^https?://"), spec("^\\./"))
    assert provably_disjoint(spec("^displayName:(en|nl)$"), spec("^description:(en|nl)$"))
    assert provably_disjoint(spec("^[.][.][a-z]+"), spec("^[.][a-z]+"))
    for a, b in [("^a+b", "^ac"), ("^ab", "^a"), ("ab", "ac"), ("^[0-9a-f]{8}$", "^[0-9A-F]{8}$"), ("^a?", "^b")]:
        assert not provably_disjoint(spec(a), spec(b)), (a, b)
    assert all(matches_everything(spec(p)) for p in ["", ".*", "x?", "^.*"])
    assert not any(matches_everything(spec(p)) for p in ["^.*$", ".+", "^a", "a"])


def test_unanchored_single_character_pattern_stays_linear():
    # ".+" is "some character that . matches": written first-occurrence style, so Python's
    # backtracking engine doesn't go quadratic on long keys
    rx = re.compile(schema_to_regex({"type": "object", "patternProperties": {".+": {"type": "integer"}}})[0])
    key = "k" * 3000
    assert rx.fullmatch(json.dumps({key: 1, "b": 2})) and not rx.fullmatch(json.dumps({key: "x"}))
    assert rx.fullmatch('{"\\n\\u2028x": 1}') and not rx.fullmatch('{"\\n": 1}')
