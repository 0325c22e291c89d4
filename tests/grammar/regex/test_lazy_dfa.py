"""A regex grammar whose DFA is built on demand allows, step by step, exactly what the grammar over
the whole DFA allows (masks, EOS, distances, budget rows), builds only part of a big DFA, and
pickles into a copy that goes on where the original was."""
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from gdserve.grammar import compile_grammar
from gdserve.grammar.json.schema import compile_json_schema
from gdserve.grammar.regex.lazy_dfa import LazyByteDFA
from gdserve.grammar.token_index import ByteDFA, mask_library

SCHEMAS = Path(__file__).parents[3] / "schemas"
REGEXES = [r"[0-9]{3}-[a-z]+", r"(a|ab)*c?", r"\"([^\"\\\x00-\x1f]|\\[\"\\/bfnrt]){0,40}\"",
           r"é[^a]{2,5}x|[\u4e00-\u9fff]+", r"\{\"a\": ?(true|false|-?[0-9]{1,6})(, ?\"b\": ?\"[a-z ]{0,30}\")?\}"]
BUDGETS = (0, 2, 7, 30)


@pytest.fixture(autouse=True, scope="module")
def native():
    if mask_library() is None:
        pytest.skip("no native kernels: the regex path builds the whole DFA")


def both(regex: str, tokenizer, monkeypatch):
    lazy = compile_grammar("regex", regex, tokenizer)
    monkeypatch.setenv("GDSERVE_LAZY_DFA", "0")
    whole = compile_grammar("regex", regex, tokenizer)
    monkeypatch.delenv("GDSERVE_LAZY_DFA")
    assert isinstance(lazy.index.dfa, LazyByteDFA) and isinstance(whole.index.dfa, ByteDFA)
    return lazy, whole


def walk_together(lazy, whole, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    ours, theirs = lazy.matcher(), whole.matcher()
    for step in range(steps):
        a, b = ours.state, theirs.state
        assert torch.equal(lazy.state_mask(a).row, whole.state_mask(b).row), step
        assert lazy.is_final(a) == whole.is_final(b)
        assert lazy.distance(a) == whole.distance(b)
        assert np.array_equal(lazy.next_distances(a), whole.next_distances(b))
        for budget in BUDGETS:
            assert torch.equal(lazy.budget_row(a, budget), whole.budget_row(b, budget)), (step, budget)
        allowed = sorted(whole.transitions(b))
        if not allowed:
            return
        token = rng.choice(allowed)
        assert ours.accept_token(token) and theirs.accept_token(token)


@pytest.mark.parametrize("regex", REGEXES)
def test_lazy_allows_what_the_whole_dfa_allows(regex, smollm2_tokenizer, monkeypatch):
    lazy, whole = both(regex, smollm2_tokenizer, monkeypatch)
    walk_together(lazy, whole, 60, seed=len(regex))


def test_schema_regexes(smollm2_tokenizer, monkeypatch):
    for path in sorted(SCHEMAS.glob("*.json"))[::6]:
        try:
            regex = compile_json_schema(json.loads(path.read_text()), None, False).regex
        except Exception:  # the grammar path's
            continue
        lazy, whole = both(regex, smollm2_tokenizer, monkeypatch)
        walk_together(lazy, whole, 40, seed=len(regex))


def test_builds_only_what_masks_reach(smollm2_tokenizer, monkeypatch):
    lazy, whole = both(r"x[a-z]{0,400}y", smollm2_tokenizer, monkeypatch)
    lazy.state_mask(lazy.initial_state)
    assert len(lazy.index.dfa.final) < len(whole.index.dfa.final) // 2


def test_pickled_copy_continues(smollm2_tokenizer, monkeypatch):
    lazy, whole = both(REGEXES[4], smollm2_tokenizer, monkeypatch)
    text = '{"a": -12, "b": "hello there"}'
    ids = smollm2_tokenizer.encode(text)
    original = lazy.matcher()
    for token in ids[:3]:
        original.fill_next_token_bitmask(torch.zeros((1, (lazy.vocab_size + 31) // 32), dtype=torch.int32))
        assert original.accept_token(token)
    copy = pickle.loads(pickle.dumps(lazy))
    assert len(copy.index.dfa.final) == len(lazy.index.dfa.final)
    state = original.state
    assert torch.equal(copy.state_mask(state).row, lazy.state_mask(state).row)
    resumed = copy.matcher()
    for token in ids:
        assert resumed.accept_token(token)
    assert copy.is_final(resumed.state)


def test_steps_that_grow_the_dfa_between_masks(smollm2_tokenizer, monkeypatch):
    """A matcher's steps build states (and may move the DFA's arrays) without a mask between:
    the next mask still equals the whole DFA's."""
    lazy, whole = both(REGEXES[4], smollm2_tokenizer, monkeypatch)
    ours, theirs = lazy.matcher(), whole.matcher()
    lazy.state_mask(ours.state)  # the index reads the DFA's arrays, then steps grow it
    for token in smollm2_tokenizer.encode('{"a": 123456, "b": "many words in a row'):
        assert ours.accept_token(token) and theirs.accept_token(token)
    assert torch.equal(lazy.state_mask(ours.state).row, whole.state_mask(theirs.state).row)
    assert np.array_equal(lazy.next_distances(ours.state), whole.next_distances(theirs.state))
