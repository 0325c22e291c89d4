"""Matcher behaviour: bitmask rows, EOS, special tokens, rollback, rejection, layout, speed."""
import random
import time

import numpy as np
import pytest
import torch

from gdserve.grammar import allocate_token_bitmask, compile_grammar
from tests.grammar.walk import Walker, allowed_ids

JSONISH = r'\{"name": "[a-zA-Z ]{1,20}", "tags": \[("[a-z]+"(, "[a-z]+")*)?\]\}'


@pytest.fixture(scope="module")
def grammar(smollm2_tokenizer):
    return compile_grammar("regex", JSONISH, smollm2_tokenizer)


def row(matcher) -> torch.Tensor:
    bitmask = allocate_token_bitmask(1, matcher.grammar.vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return bitmask[0].clone()


def test_eos_exactly_in_accepting_states_and_specials_never(grammar):
    walker = Walker(grammar)  # checks EOS bits against is_final_state in every visited state
    rng = random.Random(0)
    for _ in range(10):
        ids = walker.walk(rng, random_steps=rng.randrange(12))
        matcher = grammar.matcher()
        for token in ids:
            assert not allowed_ids(matcher) & set(range(17)) - {2}  # specials: 0..16, EOS 2
            assert not matcher.accept_token(1)  # <|im_start|> mid-text
            assert matcher.accept_token(token)
    assert len(walker._checked) > 20


def test_rejected_token_changes_nothing(grammar, smollm2_tokenizer):
    matcher = grammar.matcher()
    for token in smollm2_tokenizer.encode('{"name": "Al', add_special_tokens=False):
        assert matcher.accept_token(token)
    before = row(matcher)
    for bad in [2, 0, 1, smollm2_tokenizer.encode("}", add_special_tokens=False)[0], -1, 49152,
                10**9]:
        assert not matcher.accept_token(bad)
        assert torch.equal(row(matcher), before)
        assert not matcher.is_terminated()


def test_rollback_restores_rows_exactly(grammar, smollm2_tokenizer):
    text = '{"name": "Ada", "tags": ["x", "yz"]}'
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    matcher = grammar.matcher()
    rows = [row(matcher)]
    for token in ids:
        assert matcher.accept_token(token)
        rows.append(row(matcher))
    assert matcher.accept_token(2) and matcher.is_terminated()
    assert not matcher.accept_token(2) and not matcher.accept_token(ids[0])
    matcher.rollback(1)  # un-accept EOS: complete, only EOS may follow
    assert matcher.is_terminated() and torch.equal(row(matcher), rows[-1])
    matcher.rollback(1)
    assert not matcher.is_terminated() and torch.equal(row(matcher), rows[-2])
    assert matcher.accept_token(ids[-1])
    matcher.rollback(3)
    assert torch.equal(row(matcher), rows[-4])
    for token in ids[-3:]:  # replay
        assert matcher.accept_token(token)
    assert torch.equal(row(matcher), rows[-1])
    matcher.rollback(len(ids))
    assert torch.equal(row(matcher), rows[0])
    matcher.rollback(0)
    with pytest.raises(ValueError, match="cannot roll back 1"):
        matcher.rollback(1)


def test_is_terminated_when_only_eos_can_follow(smollm2_tokenizer):
    grammar = compile_grammar("choice", ["yes", "yesterday"], smollm2_tokenizer)
    matcher = grammar.matcher()
    assert matcher.accept_token(smollm2_tokenizer.convert_tokens_to_ids("yes"))
    assert not matcher.is_terminated()  # accepting, but "terday" may follow
    assert 2 in allowed_ids(matcher) and len(allowed_ids(matcher)) > 1
    for token in smollm2_tokenizer.encode("terday", add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.is_terminated() and allowed_ids(matcher) == {2}
    assert matcher.accept_token(2) and matcher.is_terminated()
    assert allowed_ids(matcher) == {2}  # a finished matcher still fills a usable row


def test_matchers_are_independent(grammar, smollm2_tokenizer):
    a, b = grammar.matcher(), grammar.matcher()
    assert a.accept_token(smollm2_tokenizer.encode("{", add_special_tokens=False)[0])
    assert not torch.equal(row(a), row(b))
    assert torch.equal(row(b), row(grammar.matcher()))


def test_wider_model_vocab(smollm2_tokenizer):
    grammar = compile_grammar("regex", "[a-z]+", smollm2_tokenizer, vocab_size=49152 + 100)
    matcher = grammar.matcher()
    assert row(matcher).shape == (1540,)  # ceil(49252 / 32)
    assert max(allowed_ids(matcher)) < 49152
    assert not matcher.accept_token(49200)
    with pytest.raises(ValueError, match="words per row"):
        matcher.fill_next_token_bitmask(allocate_token_bitmask(1, 49152), 0)


def test_word_layout_is_xgrammars(byte_tokenizer):
    """Token i is bit i % 32 of word i // 32 (little-endian in the int32): bit 31 is the sign."""
    vocab_size = len(byte_tokenizer)  # 259: 3 specials, then the bytes in byte-level alphabet order
    printable = [chr(c) for c in range(ord("!"), ord("~") + 1)]  # ids 3..96: 31, 63, 95 included
    grammar = compile_grammar("choice", printable, byte_tokenizer)
    bitmask = allocate_token_bitmask(2, vocab_size)
    assert bitmask.shape == (2, 9) and bitmask.dtype == torch.int32 and (bitmask == -1).all()
    grammar.matcher().fill_next_token_bitmask(bitmask, 1)
    expected = {byte_tokenizer.convert_tokens_to_ids(c) for c in printable}
    words = bitmask[1].tolist()
    got = {32 * w + b for w, word in enumerate(words) for b in range(32) if (word >> b) & 1}
    assert got == expected
    assert (bitmask[0] == -1).all()  # other rows untouched
    ids = np.array(sorted(expected))
    packed = np.zeros(9, dtype=np.uint32)
    np.bitwise_or.at(packed, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
    assert words == packed.view(np.int32).tolist()
    assert expected == set(range(3, 97)) and words[0] < 0 and words[1] == -1 and words[2] < 0


def test_fill_is_a_row_copy(grammar, smollm2_tokenizer):
    matcher = grammar.matcher()
    matcher.accept_token(smollm2_tokenizer.encode("{", add_special_tokens=False)[0])
    bitmask = allocate_token_bitmask(8, grammar.vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 3)  # builds and caches the state's row
    times = []
    for _ in range(2000):
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 3)
        times.append(time.perf_counter() - start)
    assert np.percentile(times, 50) < 50e-6


@pytest.mark.parametrize("pattern", [JSONISH, r'\{"text": "[^"\\]*", "n": -?[0-9]+\}', r"(ab|c)+d?",
                                     r'\[(\{"a": "[a-z]*"\}(, )?)*\]'])
def test_budgeted_masks_complete_within_max_tokens(pattern, smollm2_tokenizer):
    """Random walks under the engine's budget (tokens left after this one, minus one for EOS)
    always finish: EOS allowed, never a dead end, never past max_tokens."""
    grammar = compile_grammar("regex", pattern, smollm2_tokenizer)
    rng = random.Random(1)
    bitmask = allocate_token_bitmask(1, grammar.vocab_size)
    for trial in range(6):
        matcher = grammar.matcher()
        max_tokens = matcher.distance_to_complete() + 1 + rng.randrange(10)
        for step in range(max_tokens):
            matcher.fill_next_token_bitmask(bitmask, 0, budget=max_tokens - step - 2)
            words = bitmask[0].numpy().view(np.uint32)
            allowed = {i for i in range(grammar.vocab_size) if words[i >> 5] >> (i & 31) & 1}
            assert allowed and allowed <= allowed_ids(matcher)  # never outside the constraint
            token = rng.choice(sorted(allowed))
            assert matcher.accept_token(token)
            if token in grammar.eos_token_ids or matcher.is_terminated():
                break
        else:
            pytest.fail(f"{pattern}: no EOS within max_tokens={max_tokens}")


@pytest.mark.parametrize("pattern", [JSONISH, r'\{"s": "[a-z ]{0,40}", "t": "[^"]{2,9}"\}'])
def test_budget_rows_keep_the_tokens_that_complete_in_time(pattern, smollm2_tokenizer):
    """Against the rule spelled out over each token's next state: the full row where every token
    fits the budget (or none is allowed), else the tokens whose next state completes within it
    (or, before completion, within the nearest any token reaches), plus EOS where complete."""
    grammar = compile_grammar("regex", pattern, smollm2_tokenizer)
    rng, matcher = random.Random(3), grammar.matcher()
    for _ in range(12):
        state = matcher.state
        dist = {t: grammar.distance(n) for t, n in grammar.transitions(state).items()}
        full = set(np.flatnonzero(np.unpackbits(grammar.state_mask(state).row.numpy().view(np.uint8),
                                                bitorder="little")).tolist())
        for budget in (-1, 0, 1, 2, 5, 9, 20, 60):
            if not dist or max(dist.values()) <= budget:
                expected = full
            else:
                limit = budget if grammar.is_final(state) else max(budget, min(dist.values()))
                expected = {t for t, d in dist.items() if d <= limit} | (full & grammar.eos_token_ids)
            row = grammar.budget_row(state, budget).numpy().view(np.uint8)
            assert set(np.flatnonzero(np.unpackbits(row, bitorder="little")).tolist()) == expected
        assert matcher.accept_token(rng.choice(sorted(dist)))


@pytest.mark.parametrize("pattern", [JSONISH, r'\{"s": "[a-z ]{0,40}", "t": "[^"]{2,9}"\}', r"(ab|c)+d?"])
def test_budget_rows_skip_the_walk_only_where_it_would_give_the_full_row(pattern, smollm2_tokenizer,
                                                                          monkeypatch):
    """The reach bound (no token leads farther from completion than a state within the
    longest token's bytes) answers budget_row without walking next states; every row equals
    the one the walk gives."""
    import pickle
    from gdserve.grammar import matcher as matcher_module
    monkeypatch.setenv("GDSERVE_LAZY_DFA", "0")  # the bound sweeps the whole DFA (a lazy one has none)
    grammar = compile_grammar("regex", pattern, smollm2_tokenizer)
    bounded = pickle.loads(pickle.dumps(grammar))
    assert "_reach" in bounded.__dict__  # computed where it compiled, and pickled with it
    assert bounded._reach is not None
    monkeypatch.setattr(matcher_module, "MAX_REACH_SWEEP", 0)
    walked = pickle.loads(pickle.dumps(grammar))
    del walked._reach  # recomputed under the patched limit
    assert walked._reach is None
    states = np.flatnonzero(grammar.index.dfa.distance < matcher_module.UNREACHABLE)
    skipped = 0
    for state in states.tolist():
        for budget in range(grammar.max_distance + 1, -1, -3):  # the bound is tried before any walk
            before = len(bounded._max_next)
            assert torch.equal(bounded.budget_row(state, budget), walked.budget_row(state, budget))
            skipped += len(bounded._max_next) == before and budget < grammar.max_distance
    assert skipped  # the bound answered some of them
