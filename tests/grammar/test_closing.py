"""Closing before max_tokens, on every path: each constraint of the corpus (the repository's
schemas with json_object and the builtin Lark grammars; maskbench-dev where present), sampled at random
among the allowed tokens (as a random-weight model at temperature 1.0 would: strings never close
by themselves) with max_tokens just above its shortest completion, completes every time. Every
row is filled as the engine fills the row of a step whose time allowance other rows have spent:
one unit of new mask work per try, the row retried until it is ready."""
from pathlib import Path

import numpy as np
import pytest

from gdserve.bench.agents import read_schema
from gdserve.grammar import GrammarError, allocate_token_bitmask, compile_grammar
from gdserve.grammar.allowance import Allowance, MaskPending, allowing
from gdserve.grammar.cfg import budget
from gdserve.grammar.cfg.grammar import CfgGrammar
from gdserve.grammar.completion_size import shortest_completion_bytes
from gdserve.kernels.bitmask import unpack_words
from tests.helpers import CONFORMANCE, require_corpus

ROOT = Path(__file__).resolve().parents[2]
SLACKS = (0, 3, 40, 150)  # bytes past the shortest completion, taken in turn
BUILTINS = ("json", "arithmetic", "function_call", "sql_select")
MAX_TRIES = 10_000  # per row: far above what any row needs; a unit left uncached would loop forever


def corpus(name: str) -> list[tuple[str, str, object]]:
    """(name, kind, spec) for every constraint of a corpus: "schemas" (the repository's, with
    json_object and the builtin grammars) or "maskbench-dev" (the shared one; skipped if absent)."""
    if name == "maskbench-dev":
        files = sorted(require_corpus(CONFORMANCE / "maskbench-dev").rglob("*.json"))
        return [(f.name, "json", read_schema(f)) for f in files]
    items = [(f.name, "json", read_schema(f)) for f in sorted((ROOT / "schemas").glob("*.json"))]
    items.append(("json_object", "json_object", True))
    items += [(f"builtin:{name}", "grammar", f"builtin:{name}") for name in BUILTINS]
    return items


def sample_until_done(grammar, max_tokens: int, rng: np.random.Generator) -> bool:
    """Whether a random walk through the masks completes within max_tokens (EOS included),
    with each row's budget as the engine sets it."""
    matcher, bitmask = grammar.matcher(), allocate_token_bitmask(1, grammar.vocab_size)
    for n in range(max_tokens):
        fill_with_spent_allowance(matcher, bitmask, budget=max_tokens - n - 2)
        allowed = np.flatnonzero(unpack_words(bitmask[0].numpy().view(np.uint32), grammar.vocab_size))
        assert matcher.accept_token(int(rng.choice(allowed)))
        if matcher.is_terminated():
            return True
    return False


def fill_with_spent_allowance(matcher, bitmask, budget: int) -> None:
    """Fill the row with no time allowed past the first completed unit of work, retrying (each
    try keeps the units it finished) until the row is ready."""
    for _ in range(MAX_TRIES):
        allowance = Allowance.of(0.0)
        allowance.next_row()
        try:
            with allowing(allowance):
                matcher.fill_next_token_bitmask(bitmask, 0, budget=budget)
            return
        except MaskPending:
            continue
    raise AssertionError(f"a row was not ready after {MAX_TRIES} tries: some unit of work is never kept")


@pytest.mark.parametrize("corpus_name", ["schemas", "maskbench-dev"])
def test_every_constraint_closes_before_max_tokens(smollm2_tokenizer, corpus_name):
    rng = np.random.default_rng(0)
    cut, checked, unknown = [], 0, []
    for i, (name, kind, spec) in enumerate(corpus(corpus_name)):
        try:
            grammar = compile_grammar(kind, spec, smollm2_tokenizer)
        except GrammarError:
            continue  # refused with a message: tested elsewhere
        shortest = shortest_completion_bytes(grammar)
        if shortest is None:  # the completion search gave up: no closing guarantee (docs)
            unknown.append(name)
            continue
        max_tokens = shortest + 1 + SLACKS[i % len(SLACKS)]
        checked += 1
        if not sample_until_done(grammar, max_tokens, rng):
            cut.append((name, max_tokens))
    assert checked >= 30 and len(unknown) <= max(2, checked // 100), unknown
    assert cut == []


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("slack", [0, 20, 120])
def test_an_open_object_inside_a_recursive_schema_closes(smollm2_tokenizer, seed, slack):
    """Where one token opens a key of an object open to any key, near the budget: the rows keep
    only tokens after which a completion is known to fit. Inside such an object every short text
    is a new state, so the bounded completion search gives up; the state's completion then comes
    from the depth-first search, and the row is still checked."""
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "data": {"type": "object"}, "name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["data", "name"]}}, "$ref": "#/$defs/node"}
    grammar = compile_grammar("json", schema, smollm2_tokenizer, open_objects=True)
    shortest = shortest_completion_bytes(grammar)
    assert sample_until_done(grammar, shortest + 1 + slack, np.random.default_rng(seed))


def test_inside_groups_pack_alike_at_any_group_count(smollm2_tokenizer, monkeypatch):
    """A lexer state's inside groups (the tokens that stay inside a string, by the state they lead
    to) are the same packed from a table of bools or scattered word by word."""
    grammar = compile_grammar("json_object", True, smollm2_tokenizer)
    matcher = grammar.matcher()
    for token in smollm2_tokenizer.encode('{"ab', add_special_tokens=False):
        assert matcher.accept_token(token)
    (config,) = matcher.state
    table = budget.inside_groups(grammar, config.lex)
    monkeypatch.setattr(budget, "ONE_HOT_GROUPS", 0)
    scattered = budget.inside_groups(grammar, config.lex)
    assert len(table.ends) > 1 and table.ends == scattered.ends
    assert np.array_equal(table.words, scattered.words)



GRAMMAR_PATH = [("json_object", True), ("grammar", "builtin:json"), ("grammar", "builtin:function_call"),
                ("grammar", "builtin:sql_select"), ("json", "agents/extract_expense_report.json")]


@pytest.mark.parametrize("slack", [0, 2, 10])
@pytest.mark.parametrize("kind,spec", GRAMMAR_PATH)
def test_grammar_path_closes_within_its_completion_in_tokens(smollm2_tokenizer, kind, spec, slack):
    """On the grammar path a completion counts the tokens of its greedy tokenization, not its
    bytes: a max_tokens just above that count, well below the bytes, still completes."""
    spec = read_schema(ROOT / "schemas" / spec) if kind == "json" else spec
    grammar = compile_grammar(kind, spec, smollm2_tokenizer)
    assert isinstance(grammar, CfgGrammar)
    own = grammar.completion(grammar.initial)
    tokens = grammar.text_tokens(own)
    assert tokens < len(own) or len(own) < 4
    for seed in range(3):
        assert sample_until_done(grammar, tokens + 1 + slack, np.random.default_rng(seed))
