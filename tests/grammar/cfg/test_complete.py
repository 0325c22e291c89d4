"""Completions from the start of a grammar: the shortest sentence read off the rules is what the
search over matcher states finds, the matcher reads it to an accepting state, and where adjacent
lexemes would read as others the search answers instead."""
import json
from pathlib import Path

import pytest

from gdserve.grammar import compile_grammar
from gdserve.grammar.cfg.complete import search_completion, shortest_sentence
from gdserve.grammar.cfg.lalr import Rule
from gdserve.grammar.cfg.lark_spec import Terminal

SCHEMAS = Path(__file__).parents[3] / "schemas"
BUILTINS = ["json", "sql_select", "arithmetic", "function_call"]


def _cfg_schemas() -> list[str]:
    return sorted(p.name for p in SCHEMAS.glob("*.json"))[::3]


def _terminal(name: str) -> Terminal:
    return Terminal(name, name.lower(), 0, True, False)


def test_shortest_sentence_takes_each_nonterminals_cheapest_rule():
    rules = [Rule("start", ("A", "list", "B")), Rule("list", ("item", "list")), Rule("list", ("item",)),
             Rule("item", ("CC", "CC")), Rule("item", ("DDD",)), Rule("item", ("loop",)),
             Rule("loop", ("loop", "A"))]
    terminals = tuple(_terminal(n) for n in ("A", "B", "CC", "DDD"))
    spellings = [b"a", b"b", b"cc", b"ddd"]
    assert shortest_sentence(rules, terminals, spellings) == b"adddb"
    assert shortest_sentence(rules, terminals, [b"a", b"b", b"c", b"ddd"]) == b"accb"


def test_no_sentence_where_the_start_derives_no_text():
    rules = [Rule("start", ("A", "start"))]
    assert shortest_sentence(rules, (_terminal("A"),), [b"a"]) is None
    assert shortest_sentence([Rule("start", ("A",))], (_terminal("A"),), [None]) is None
    assert shortest_sentence((), (), []) is None


def _start_completion_is_the_searched_shortest(grammar):
    grammar = getattr(grammar, "base", grammar)
    text = grammar.completion(grammar.initial)
    assert text is not None
    after = grammar.advance(grammar.initial, text) if text else grammar.initial
    assert after is not None and grammar.accepts_eos(after)
    searched, _ = search_completion(grammar, grammar.initial)
    if searched is not None:
        assert len(text) == len(searched)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_grammars_start_completion(smollm2_tokenizer, name):
    _start_completion_is_the_searched_shortest(compile_grammar("grammar", f"builtin:{name}", smollm2_tokenizer))


@pytest.mark.parametrize("name", _cfg_schemas())
def test_open_object_schemas_start_completion(smollm2_tokenizer, name):
    schema = json.loads((SCHEMAS / name).read_text())
    grammar = compile_grammar("json", schema, smollm2_tokenizer, open_objects=True)
    if hasattr(getattr(grammar, "base", grammar), "initial"):  # on the grammar path
        _start_completion_is_the_searched_shortest(grammar)


def test_lexemes_that_would_merge_are_separated(smollm2_tokenizer):
    grammar = compile_grammar("grammar", 'start: WORD WORD\nWORD: /[a-z]+/\n%ignore " "', smollm2_tokenizer)
    assert grammar.completion(grammar.initial) == b"a a"
