"""open_objects: objects admit undeclared keys wherever JSON Schema does (any JSON value at any depth
where additionalProperties is absent), before, between and after the declared members, on the
grammar path; token by token on SmolLM2's vocabulary, accepted exactly when a validator accepts
(declared members in schema order). The default closes such objects and reports it."""
import itertools
import json
import random

import jsonschema
import pytest

from gdserve.grammar import compile_grammar
from gdserve.grammar.cfg.sample import SentenceSampler
from gdserve.grammar.errors import RecursiveSchemaError
from gdserve.grammar.json.schema import compile_json_schema
from gdserve.grammar.json.schema_cfg import schema_to_grammar
from tests.grammar.walk import accepts_all, allowed_ids, is_json, tokenized_mutants

SCHEMAS = {
    "flat": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0}, "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}, "required": ["name"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"age": {"type": "integer"}, "nick": {"type": "string"}},
                 "required": ["age"]},
        "ok": {"type": "boolean"}}, "required": ["user", "ok"]},
    "all_optional": {"type": "object", "properties": {"a": {"type": "null"}, "b": {"const": 1}},
                     "minProperties": 1},
    "typed_extras": {"type": "object", "properties": {"k": {"type": "string"}},
                     "additionalProperties": {"type": "integer"}},
}
EXTRAS = [("x", 1), ("y", {"deep": [1, {"deeper": [None, {"deepest": "s"}]}]}), ("z", [[], {}]),
          ("n\u00e4me", "v"), ("", None)]


def grammar(tokenizer, name: str):
    return compile_grammar("json", SCHEMAS[name], tokenizer, open_objects=True)


def with_extras(instance: dict, extras: list, rng: random.Random) -> dict:
    """instance with the extras inserted at random positions (declared members keep their order)."""
    items = list(instance.items())
    for key, value in extras:
        items.insert(rng.randrange(len(items) + 1), (key, value))
    return dict(items)


BASES = {
    "flat": [{"name": "ab"}, {"id": 3, "name": "", "tags": ["a", "b"]}, {"id": -1, "name": "x"},
             {"name": "toolongname"}, {"id": 1}],
    "nested": [{"user": {"age": 30}, "ok": True}, {"user": {"age": 1, "nick": "n"}, "ok": False},
               {"user": {"nick": "n"}, "ok": True}, {"ok": True}],
    "all_optional": [{"a": None}, {"a": None, "b": 1}, {"b": 2}, {}],
    "typed_extras": [{"k": "v"}, {}],
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_accepted_exactly_when_valid(smollm2_tokenizer, name):
    g, rng = grammar(smollm2_tokenizer, name), random.Random(0)
    checked = {True: 0, False: 0}
    for base in BASES[name]:
        for extras in ([], EXTRAS[:1], EXTRAS[1:3], EXTRAS):
            instance = with_extras(base, extras, rng)
            if name == "nested" and isinstance(instance.get("user"), dict) and extras:
                instance["user"] = with_extras(instance["user"], extras[:2], rng)
            for text in (json.dumps(instance), json.dumps(instance, indent=2)):
                valid = jsonschema.Draft202012Validator(SCHEMAS[name]).is_valid(instance)
                ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
                assert accepts_all(g, ids) == valid, text
                checked[valid] += 1
    assert checked[True] >= 8 and checked[False] >= 4


@pytest.mark.parametrize("name", SCHEMAS)
def test_mutants_are_accepted_only_when_valid(smollm2_tokenizer, name):
    g, rng = grammar(smollm2_tokenizer, name), random.Random(1)
    sampler = SentenceSampler(schema_to_grammar(SCHEMAS[name], open_objects=True).lark, max_depth=4,
                              accept=is_json)
    texts = [sampler.sentence(rng) for _ in range(20)]
    for text in texts:  # sentences of the grammar are valid and accepted
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    rejected = 0
    for mutant, ids in tokenized_mutants(smollm2_tokenizer, g, texts, rng):
        if accepts_all(g, ids):
            jsonschema.validate(json.loads(mutant), SCHEMAS[name])
        else:
            rejected += 1
    assert rejected >= 5


def test_declared_names_never_repeat(smollm2_tokenizer):
    g = grammar(smollm2_tokenizer, "flat")
    for text in ('{"name": "a", "name": "b"}', '{"name": "a", "\\u006eame": "b"}',
                 '{"id": 1, "x": 2, "id": 3, "name": "a"}', '{"tags": [], "name": "a", "tags": []}'):
        assert not accepts_all(g, smollm2_tokenizer.encode(text, add_special_tokens=False)), text


def test_declared_members_in_any_order_up_to_the_limit(smollm2_tokenizer):
    small = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdef"}, "required": ["f", "a"]}
    large = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdefg"}, "required": ["g"]}
    g_small, g_large = (compile_grammar("json", s, smollm2_tokenizer, open_objects=True) for s in (small, large))
    cases = [(g_small, {"f": 1, "x": 0, "c": 2, "a": 3}, True), (g_small, {"c": 2, "a": 3}, False),
             (g_small, {k: 1 for k in "fedcba"}, True), (g_large, {"a": 1, "g": 2, "q": 3}, True),
             (g_large, {"g": 2, "a": 1}, False)]  # more than ORDERLESS_MAX: schema order (narrowed)
    for g, instance, accepted in cases:
        ids = smollm2_tokenizer.encode(json.dumps(instance), add_special_tokens=False)
        assert accepts_all(g, ids) == accepted, instance
    assert any("declared properties in schema order" in a for a in g_large.report["approximated"])
    assert not any("schema order" in a for a in g_small.report["approximated"])


AREA = {"type": "object", "required": ["shape"], "properties": {
    "shape": {"enum": ["circle", "rectangle"]}, "radius": {"type": "number"}, "length": {"type": "number"},
    "width": {"type": "number"}}}
PRESENCE = {
    "one_of_required": {**AREA, "oneOf": [{"required": ["radius"]}, {"required": ["length", "width"]}]},
    "any_of_required": {**AREA, "anyOf": [{"required": ["radius"]}, {"required": ["length"]}]},
    "dependent": {**AREA, "dependentRequired": {"length": ["width"]}, "oneOf": [
        {"required": ["radius"], "not": {"required": ["width"]}}, {"required": ["width"]}]},
}


@pytest.mark.parametrize("name", PRESENCE)
def test_branches_differing_in_required_keys_are_one_open_object(smollm2_tokenizer, name):
    """anyOf/oneOf branches that only require (or exclude) declared keys: one object whose rules
    track the keys read, exact in any key order with undeclared keys (no fallback to closed)."""
    schema, rng = PRESENCE[name], random.Random(6)
    g = compile_grammar("json", schema, smollm2_tokenizer, open_objects=True)
    assert g.kind == "json" and g.report["approximated"] == [], g.report
    keys, values = ["shape", "radius", "length", "width", "extra"], {"shape": "circle", "extra": {"k": [1]}}
    checked = {True: 0, False: 0}
    for size in range(len(keys) + 1):
        for combo in itertools.permutations(keys, size):
            if rng.random() < 0.25:
                instance = {k: values.get(k, 2) for k in combo}
                valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
                ids = smollm2_tokenizer.encode(json.dumps(instance), add_special_tokens=False)
                assert accepts_all(g, ids) == valid, instance
                checked[valid] += 1
    assert min(checked.values()) >= 10, checked


def test_a_capped_state_keeps_masks_and_accepts_agreeing(smollm2_tokenizer, monkeypatch):
    """Past MAX_CONFIGS a state keeps a subset of its parses (here 1): every token its mask allows
    is accepted, and what is accepted stays valid."""
    monkeypatch.setattr("gdserve.grammar.cfg.grammar.MAX_CONFIGS", 1)
    items = {"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                       {"type": "object", "properties": {"b": {"type": "integer"}}}]}
    schema = {"type": "object", "properties": {"list": {"type": "array", "items": items}}}
    g, rng = compile_grammar("json", schema, smollm2_tokenizer, open_objects=True), random.Random(7)
    validator = jsonschema.Draft202012Validator(schema)
    for _ in range(3):
        m, ids = g.matcher(), []
        for token in smollm2_tokenizer.encode('{"list": [{"c": 1, "a": "x"}, {', add_special_tokens=False):
            assert token in allowed_ids(m) and m.accept_token(token)
            ids.append(token)
        for _ in range(40):
            allowed = sorted(allowed_ids(m))
            token = rng.choice(allowed)
            assert m.accept_token(token)
            if token in g.eos_token_ids:
                break
            ids.append(token)
        if m.is_terminated():
            assert validator.is_valid(json.loads(smollm2_tokenizer.decode(ids)))


def test_closed_objects_are_the_default_and_reported():
    schema = SCHEMAS["flat"]
    closed = compile_json_schema(schema)
    assert any("only the declared properties" in n for n in closed.narrowed)
    for name in ("flat", "typed_extras"):  # members anywhere: the grammar path
        with pytest.raises(RecursiveSchemaError, match="open_objects"):
            compile_json_schema(SCHEMAS[name], open_objects=True)
    assert compile_json_schema({"type": "object"}, open_objects=True).narrowed == []  # a map: a regex


def test_overlapping_branches_beside_undeclared_members_are_followed_every_way(smollm2_tokenizer):
    """anyOf branches that overlap, beside undeclared members, make the grammar ambiguous (not
    LALR(1)): the matcher follows each parse, so objects stay open and the constraint exact."""
    items = {"properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "additionalProperties": False,
             "dependencies": {"a": ["b"]}}  # no "type": each dependency branch admits any array too
    schema = {"type": "object", "properties": {"list": {"type": "array", "items": items}}}
    g = compile_grammar("json", schema, smollm2_tokenizer, open_objects=True)
    assert g.report["approximated"] == []
    validator = jsonschema.Draft7Validator(schema)
    for instance in ({"list": [{"a": "x", "b": "y"}, [1]]}, {"list": [{"a": "x"}]}, {"list": []},
                     {"list": [], "other": 1}, {"x": {"list": 1}, "list": [{"b": "y"}, 3, "s"]},
                     {"list": [{"b": "y", "c": 1}]}, {"list": [{"b": "y"}], "z": [{"a": 1}]}):
        ids = smollm2_tokenizer.encode(json.dumps(instance), add_special_tokens=False)
        assert accepts_all(g, ids) == validator.is_valid(instance), instance