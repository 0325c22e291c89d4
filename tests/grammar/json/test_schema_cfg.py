"""Recursive JSON Schemas and json_object on the grammar path (json.schema_cfg), on SmolLM2's
vocabulary: sentences of the generated grammar are schema-valid and accepted token by token under
several tokenizations; budgeted random walks end in valid instances; a mutant the matcher accepts is
valid; a $ref cycle with no container in it raises; SmolLM2's generations validate."""
import json
import pickle
import random
import re

import jsonschema
import numpy as np
import pydantic
import pytest
import torch

from gdserve import LLM, SamplingParams
from gdserve.grammar import GrammarError, compile_grammar
from gdserve.grammar.cfg.sample import SentenceSampler
from gdserve.grammar.json.schema import compile_json_schema_rules
from gdserve.grammar.json.schema_cfg import schema_to_grammar
from gdserve.sampling_params import StructuredOutputsParams
from tests.grammar.walk import (accepts_all, allowed_ids, is_json, random_split, single_byte_ids, token_ids_by_bytes,
                               tokenized_mutants)
from tests.helpers import chat_ids


class Category(pydantic.BaseModel):
    name: str
    subcategories: list["Category"] = []


SCHEMAS = {
    "tree": {"$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["name", "children"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
    "linked_list": {"type": "object", "properties": {
        "value": {"type": "integer", "minimum": 0, "maximum": 99},
        "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["value", "next"], "additionalProperties": False},
    "comments": {"type": "object", "properties": {
        "author": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "text": {"type": "string"},
        "replies": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["author", "text"], "additionalProperties": False},
    "json_value": {"$defs": {"v": {"anyOf": [
        {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
        {"type": "array", "items": {"$ref": "#/$defs/v"}},
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/v"}}]}}, "$ref": "#/$defs/v"},
    "expression": {"$defs": {"e": {"oneOf": [
        {"type": "object", "properties": {"op": {"enum": ["+", "*"]},
                                          "args": {"type": "array", "items": {"$ref": "#/$defs/e"}, "minItems": 2}},
         "required": ["op", "args"], "additionalProperties": False},
        {"type": "integer"}]}}, "$ref": "#/$defs/e"},
    "pydantic": Category.model_json_schema(),
    "with_any_value": {"type": "object", "properties": {
        "meta": {}, "child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["meta", "child"], "additionalProperties": False},
    # keys sharing a prefix: a terminal ends inside `"con` in one branch and goes on in another
    "shared_key_prefix": {"type": "object", "additionalProperties": False, "properties": {
        "a": {"type": "string"}, "conditions": {"type": "string"},
        "contributors": {"type": "array", "items": {"type": "object"}},
        "tree": {"$ref": "#/$defs/n"}},
        "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}},
    # strings of bounded length: each bound a terminal of its own (cfg.lexer composes its DFA)
    "long_strings": {"$defs": {"n": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 40},
        "note": {"type": "string", "maxLength": 200},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2}},
        "required": ["name"], "additionalProperties": False}}, "$ref": "#/$defs/n"},
}
_COMPILED: dict = {}


def grammar_of(tokenizer, name: str):
    if name not in _COMPILED:
        _COMPILED[name] = compile_grammar("json", SCHEMAS[name], tokenizer)
    return _COMPILED[name]


def sentences(name: str, count: int, seed: int = 0) -> list[str]:
    """Random sentences of the schema's grammar (lark's own lexer reads some otherwise than ours:
    kept are the ones that parse as JSON)."""
    sampler = SentenceSampler(schema_to_grammar(SCHEMAS[name]).lark, max_depth=4, accept=is_json)
    rng = random.Random(seed)
    return [sampler.sentence(rng) for _ in range(count)]


@pytest.mark.parametrize("name", SCHEMAS)
def test_sentences_are_valid_and_accepted_under_several_tokenizations(smollm2_tokenizer, name):
    g = grammar_of(smollm2_tokenizer, name)
    assert g.kind == "json" and g.relaxed == []
    rng, by_bytes = random.Random(1), token_ids_by_bytes(g)
    singles = {bytes([b]): t for b, t in single_byte_ids(g).items()}
    checked = 0
    for text in sentences(name, 10):
        jsonschema.validate(json.loads(text), SCHEMAS[name])
        data = text.encode()
        splits = [smollm2_tokenizer.encode(text, add_special_tokens=False),
                  random_split(data, singles, rng), random_split(data, by_bytes, rng)]
        for ids in splits:
            if ids and b"".join(g.token_data(t) for t in ids) == data:  # lossy tokenizing
                assert accepts_all(g, ids), text
                checked += 1
    assert checked >= 15


@pytest.mark.parametrize("name", SCHEMAS)
def test_mutants_are_accepted_only_when_valid(smollm2_tokenizer, name):
    g, rng = grammar_of(smollm2_tokenizer, name), random.Random(2)
    rejected = 0
    for mutant, ids in tokenized_mutants(smollm2_tokenizer, g, sentences(name, 20, seed=3), rng):
        if accepts_all(g, ids):
            jsonschema.validate(json.loads(mutant), SCHEMAS[name])
        else:
            rejected += 1
    assert rejected >= 5



def budgeted_walk(g, max_tokens: int, rng: random.Random) -> bytes:
    """Uniformly random allowed tokens under the engine's budget (max_tokens, EOS included); the
    matcher must have terminated within it. Returns the text."""
    eos, ids, m = min(g.eos_token_ids), [], g.matcher()
    bitmask = torch.zeros((1, (g.vocab_size + 31) // 32), dtype=torch.int32)
    for used in range(max_tokens):
        m.fill_next_token_bitmask(bitmask, 0, budget=max_tokens - used - 2)
        bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
        token = rng.choice(np.flatnonzero(bits[:g.vocab_size]).tolist())
        assert m.accept_token(token)
        if token == eos:
            break
        ids.append(token)
    assert m.is_terminated()
    return b"".join(g.token_data(t) for t in ids)

@pytest.mark.parametrize("name", SCHEMAS)
def test_budgeted_random_walks_end_valid(smollm2_tokenizer, name):
    """Uniformly random allowed tokens under the engine's budget close the recursion in time."""
    g, rng = grammar_of(smollm2_tokenizer, name), random.Random(4)
    for _ in range(4):
        jsonschema.validate(json.loads(budgeted_walk(g, 64, rng)), SCHEMAS[name])


def test_a_lexeme_ends_wherever_the_rest_parses(smollm2_tokenizer):
    """Maximal munch would read `, "con` as the start of the "conditions" member's terminal and
    reject "contributors" once that terminal dies; the matcher follows every split."""
    g = grammar_of(smollm2_tokenizer, "shared_key_prefix")
    valid = [{"a": "x", "contributors": [{"k": 1}]}, {"a": "x", "conditions": "c", "tree": [[]]},
             {"contributors": [], "tree": [[], [[]]]}, {"a": "", "contributors": [{}], "tree": []}]
    for instance in valid:
        for text in (json.dumps(instance), json.dumps(instance, indent=2)):
            ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
            assert accepts_all(g, ids), text
    for text in ('{"a": "x", "con": 1}', '{"a": "x", "contributors": {}}', '{"conditions": [], "tree": []}',
                 '{"a": 1}', '{"contributors": [], "a": "x", "b": 1}'):
        assert not accepts_all(g, smollm2_tokenizer.encode(text, add_special_tokens=False)), text


def test_masks_without_the_native_walk_agree(smollm2_tokenizer, monkeypatch):
    """cfg.masks' numpy walk (no C compiler) allows the same tokens, splits included."""
    text = json.dumps({"a": "x", "contributors": [{"k": 1, "l": [2.5]}], "tree": [[]]}, indent=2)
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)

    def masks() -> list[set[int]]:
        m, out = compile_grammar("json", SCHEMAS["shared_key_prefix"], smollm2_tokenizer).matcher(), []
        for t in ids:
            out.append(allowed_ids(m))
            assert m.accept_token(t)
        return out
    native = masks()
    for module in ("token_index", "cfg.masks"):
        monkeypatch.setattr(f"gdserve.grammar.{module}.mask_library", lambda: None)
    assert masks() == native


def test_keys_with_values_alike_share_walks_and_masks(smollm2_tokenizer, monkeypatch):
    """Keys whose values are written alike share their value's states' walks (Lexer.shared_key):
    the same masks as a walk per state, each key's own terminal completed."""
    schema = {"type": "object", "properties": {
        **{k: {"type": "string"} for k in ("app", "name", "lang")}, "size": {"type": "string", "maxLength": 30},
        "n": {"type": "integer"}, "m": {"type": "integer"}, "sub": {"type": "object", "properties": {
            "name": {"type": "string"}, "n": {"type": "integer"}}}}, "required": ["app"]}
    text = json.dumps({"app": "a\"b", "name": "é x", "lang": "en", "size": "12", "n": 1, "m": -20,
                       "sub": {"name": "y", "n": 3}})
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)

    def masks() -> tuple[list[set[int]], int]:
        g = compile_grammar("json", schema, smollm2_tokenizer, open_objects=True)
        m, out = g.matcher(), []
        for t in ids:
            out.append(allowed_ids(m))
            assert m.accept_token(t)
        return out, len(g._shared_roots)
    shared, families = masks()
    assert families > 3
    monkeypatch.setattr("gdserve.grammar.cfg.lexer.Lexer.shared_key", lambda self, state: None)
    assert masks() == (shared, 0)


def test_json_object_is_any_object_at_any_depth(smollm2_tokenizer):
    g = compile_grammar("json_object", True, smollm2_tokenizer)
    shallow = {"a": [{"b": {"c": [{"d": None, "e": [1.5e3, "x\\\"y", True]}]}}]}
    deep = shallow
    for _ in range(6):
        deep = {"k": [deep, {}]}
    # any depth; pretty-printed up to the whitespace's indent cap (json.schema.INDENT_MAX columns)
    for text in (json.dumps(deep), json.dumps(shallow, indent=2), "{}", '{"a": {}}'):
        assert accepts_all(g, smollm2_tokenizer.encode(text, add_special_tokens=False)), text
    for text in ("[1]", "3", '"s"', '{"a": }', '{"a": 1,}'):
        assert not accepts_all(g, smollm2_tokenizer.encode(text, add_special_tokens=False)), text


def test_unconstrained_values_are_exact_on_the_grammar_path():
    rules = compile_json_schema_rules(SCHEMAS["with_any_value"])
    assert rules.relaxed == [] and "json_value" in rules.rules


def test_long_strings_keep_their_bounds_in_terminals_of_their_own(smollm2_tokenizer):
    g = grammar_of(smollm2_tokenizer, "long_strings")
    for instance in ({"name": "ab"}, {"name": "é" * 40, "note": "x" * 200}, {"name": "a"},
                     {"name": "x" * 41}, {"name": "ab", "note": "\\" * 201},
                     {"name": "ab", "kids": [{"name": "c" * 40, "note": ""}]}, {"name": "ab", "kids": [{"name": "c"}]}):
        text = json.dumps(instance, ensure_ascii=False)
        valid = jsonschema.Draft202012Validator(SCHEMAS["long_strings"]).is_valid(instance)
        assert accepts_all(g, smollm2_tokenizer.encode(text, add_special_tokens=False)) == valid, text
    terminals = schema_to_grammar(SCHEMAS["long_strings"]).terminals.values()
    assert not [t for t in terminals if len(re.findall(r"\{\d+,\d+\}", t.replace("{0,24}", ""))) > 1]


def test_a_cycle_with_no_container_raises(smollm2_tokenizer):
    schema = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    with pytest.raises(GrammarError, match="cycle through #/\\$defs/a with no object or array in between"):
        compile_grammar("json", schema, smollm2_tokenizer)


def test_a_schema_too_large_for_a_regex_takes_the_grammar_path(smollm2_tokenizer, monkeypatch):
    """(The regex limit lowered so that a small schema is "too large".) Its large subschema, reached
    from three places, is one rule; instances are accepted exactly as a validator decides."""
    from functools import partial

    from gdserve.grammar import compiler
    from gdserve.grammar.json import schema as json_schema
    from gdserve.grammar.regex.tree import placeholder
    monkeypatch.setattr(compiler, "compile_json_schema", partial(json_schema.compile_json_schema,
                                                                 max_regex_chars=1500))
    monkeypatch.setattr(json_schema, "RULE_MIN_CHARS", 300)
    item = {"type": "object", "properties": {"at": {"type": "string", "format": "date"},
                                             "n": {"type": "integer", "minimum": 1, "maximum": 12}},
            "required": ["at"], "additionalProperties": False}
    schema = {"$defs": {"item": item}, "type": "object", "additionalProperties": False,
              "properties": {k: {"$ref": "#/$defs/item"} for k in ("a", "b", "c")}}
    assert len(json_schema.compile_json_schema(schema, max_regex_chars=10**6).regex) > 1500
    rules = json_schema.compile_json_schema_rules(schema)
    assert list(rules.rules) == ["r0"] and placeholder("r0") in rules.root
    g = compile_grammar("json", schema, smollm2_tokenizer)
    assert g.regex is None  # a CfgGrammar
    for instance in ({"a": {"at": "2024-02-29", "n": 3}, "c": {"at": "1999-12-31"}}, {},
                     {"a": {"at": "2024-02-30"}}, {"b": {"n": 3}}, {"a": {"at": "2024-01-01", "n": 13}}):
        text = json.dumps(instance)
        valid = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).is_valid(instance)
        assert accepts_all(g, smollm2_tokenizer.encode(text, add_special_tokens=False)) == valid, text


def test_a_regex_that_expands_too_far_takes_the_grammar_path(smollm2_tokenizer, monkeypatch):
    """Nested bounded repetitions: a short regex whose automaton would be huge (limits lowered so
    that a small schema crosses them) compiles as a grammar, exact."""
    from gdserve.grammar.json import schema as json_schema
    monkeypatch.setattr(json_schema, "MAX_EXPANDED_SIZE", 2000)
    monkeypatch.setattr(json_schema, "EXPANSION_CHECK_CHARS", 100)
    monkeypatch.setattr(json_schema, "RULE_MIN_CHARS", 100)
    item = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 8}},
            "required": ["a"], "additionalProperties": False}
    schema = {"type": "array", "items": item, "maxItems": 20}
    with pytest.raises(GrammarError, match="expands to"):
        json_schema.compile_json_schema(schema)
    g = compile_grammar("json", schema, smollm2_tokenizer)
    assert g.regex is None  # a CfgGrammar
    for instance in ([], [{"a": "x" * 8}] * 20, [{"a": "x" * 9}], [{"a": ""}] * 21, [{}]):
        text = json.dumps(instance)
        valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
        assert accepts_all(g, smollm2_tokenizer.encode(text, add_special_tokens=False)) == valid, text


def test_smollm2_generations_validate(smollm2_dir):
    llm = LLM(str(smollm2_dir), dtype="float32", kv_cache_memory=256 << 20)
    cases = [("tree", "Describe a small family tree as JSON."),
             ("comments", "Write a comment thread with a reply as JSON."),
             ("expression", "Write the expression (1 + 2) * 3 as a JSON tree."),
             ("pydantic", "Give a product category with two subcategories as JSON.")]
    params = [SamplingParams(max_tokens=120, temperature=0.0,
                             structured_outputs=StructuredOutputsParams(json=SCHEMAS[name]))
              for name, _ in cases]
    try:
        outs = llm.generate([chat_ids(llm, prompt) for _, prompt in cases], params)
    finally:
        llm.engine.close()
    for (name, _), out in zip(cases, outs):
        assert out.outputs[0].finish_reason == "stop", (name, out.outputs[0].text)
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMAS[name])
    Category.model_validate_json(outs[3].outputs[0].text)


def test_steering_over_thousands_of_terminals_is_built_at_compile(smollm2_tokenizer):
    """What steering to completion reads (each terminal's shortest spelling) is built where the
    grammar compiles and travels with it when pickled, so a matcher near its budget builds no
    per-terminal table on the engine's loop; with thousands of terminals (a big enum) budgeted
    random walks still close in time and validate."""
    schema = {"$defs": {"node": {"type": "object", "required": ["tag", "next"], "properties": {
        "tag": {"enum": [f"v{i:05d}" for i in range(1500)]},
        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}}, "$ref": "#/$defs/node"}
    g = pickle.loads(pickle.dumps(compile_grammar("json", schema, smollm2_tokenizer)))
    assert "terminal_spellings" in vars(g)
    rng = random.Random(7)
    for _ in range(2):
        jsonschema.validate(json.loads(budgeted_walk(g, 40, rng)), schema)


def test_a_completion_many_levels_deep_is_found_and_steered_to(smollm2_tokenizer):
    """From the start of a schema whose required members nest ten objects deep, the shortest
    completion opens every level; random walks given just a few tokens more than it close in time."""
    level: dict = {"$ref": "#/$defs/node"}
    for depth in range(10):
        level = {"type": "object", "required": [f"k{depth}", "tag"],
                 "properties": {f"k{depth}": level, "tag": {"type": "string"}}}
    node = {"type": "object", "required": ["name", "kids"],
            "properties": {"name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
    schema = {**level, "$defs": {"node": node}}
    g = compile_grammar("json", schema, smollm2_tokenizer)
    shortest = g.matcher().distance_to_complete()
    assert shortest > 100
    rng = random.Random(3)
    for _ in range(3):
        jsonschema.validate(json.loads(budgeted_walk(g, shortest + 4, rng)), schema)
