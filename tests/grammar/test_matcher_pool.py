"""Matchers in worker processes: the same answers, forced tokens and rows as matchers on the
caller's thread, and a worker that dies fails only the sequences placed on it."""
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

from gdserve.grammar import compile_grammar
from gdserve.grammar.allowance import Allowance
from gdserve.grammar.forced import take_forced_tokens, text_encoder
from gdserve.grammar.matcher_pool import (ACCEPTED, PARKED, READY, TERMINATED, MatcherPool, Unplaceable,
                                          advance_matcher)
from gdserve.grammar.service import CompileService
from gdserve.grammar.vocabulary import token_vocabulary
from gdserve.kernels.bitmask import bitmask_width, unpack_words
from tests.grammar.slow_grammar import UNIT_S, SlowRowGrammar

CONSTRAINTS = [("json", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                          "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
                         "required": ["name", "tags"]}),
               ("json_object", True), ("regex", r"id-[a-z]{2,5}-\d{1,3}"), ("choice", ["yes", "no", "maybe"])]
FAR = 1e9  # a deadline no test reaches: nothing parks


@pytest.fixture
def pool(smollm2_tokenizer):
    pool = MatcherPool(token_vocabulary(smollm2_tokenizer), 2, bitmask_width(len(smollm2_tokenizer)),
                       text_encoder(smollm2_tokenizer))
    pool.start()
    yield pool
    pool.close()


def _compiled(tokenizer, placed_from: str) -> tuple[list, list[bytes | None]]:
    """The CONSTRAINTS' grammars and the bytes each is placed from (None: the pool pickles it)."""
    if placed_from == "pickled here":
        return [compile_grammar(kind, spec, tokenizer) for kind, spec in CONSTRAINTS], [None] * len(CONSTRAINTS)
    with CompileService(tokenizer, max_workers=1, keep_payloads=True) as service:
        grammars = [service.compile(kind, spec) for kind, spec in CONSTRAINTS]
        payloads = [service.take_payload(g) for g in grammars]
    assert all(payloads)
    return grammars, payloads


@pytest.mark.parametrize("placed_from", ["pickled here", "compile worker's bytes"])
def test_pool_matchers_answer_as_local_ones(smollm2_tokenizer, pool, placed_from):
    """Of each grammar's two sequences, the second takes the forced text (from its start on):
    the same tokens as on the caller's thread."""
    vocab_size, encode = len(smollm2_tokenizer), text_encoder(smollm2_tokenizer)
    grammars, payloads = _compiled(smollm2_tokenizer, placed_from)
    local = [g.matcher() for g in grammars for _ in range(2)]
    limits = [0, 1000] * len(grammars)
    starts = [take_forced_tokens(m, encode, b"", limit) for m, limit in zip(local, limits)]
    remote = [pool.matcher(g, p, start) for (g, p), start in zip([gp for gp in zip(grammars, payloads) for _ in range(2)],
                                                                 starts)]
    rng = np.random.default_rng(0)
    out = np.zeros((len(remote), bitmask_width(vocab_size)), dtype=np.uint32)
    budgets = [40 - n for n in range(len(local))]
    running = list(range(len(local)))
    num_forced = 0
    for step in range(40):
        answers = pool.fill_rows([(remote[i], budgets[i]) for i in running], FAR, out)
        assert answers == [READY] * len(running)
        tokens = []
        for k, i in enumerate(running):
            row = local[i].next_token_row(budgets[i]).numpy().view(np.uint32)
            assert np.array_equal(out[k], row)
            allowed = np.flatnonzero(unpack_words(row, vocab_size))
            # now and then a token the grammar refuses: no change on either side
            tokens.append(int(rng.integers(vocab_size)) if step % 7 == 3 else int(rng.choice(allowed)))
        answers = pool.advance([(remote[i], t, budgets[i] - 1, limits[i]) for i, t in zip(running, tokens)], FAR)
        for i, t, answer in zip(running, tokens, answers):
            assert answer == advance_matcher(local[i], t, Allowance(FAR), limits[i], encode)
            budgets[i] -= 1 + len(answer[1])
            num_forced += len(answer[1])
        running = [i for i, (a, _) in zip(running, answers) if a != TERMINATED]
        if not running:
            break
    assert not running, "every walk ends within its budget"
    assert num_forced


def test_a_dead_worker_fails_its_sequences_alone_and_a_new_one_takes_new_ones(smollm2_tokenizer, pool):
    first, second = (compile_grammar("regex", r"[a-z]{1,40}", smollm2_tokenizer),
                     compile_grammar("regex", r"\d{1,40}", smollm2_tokenizer))
    doomed, kept = pool.matcher(first), pool.matcher(second)
    assert doomed.worker != kept.worker  # placed apart: each on the worker with the least work
    a = smollm2_tokenizer.encode("a", add_special_tokens=False)[0]
    one = smollm2_tokenizer.encode("1", add_special_tokens=False)[0]
    assert pool.advance([(doomed, a, 30, 0), (kept, one, 30, 0)], FAR) == [(ACCEPTED, []), (ACCEPTED, [])]
    os.kill(pool.worker_pids()[doomed.worker], signal.SIGKILL)
    time.sleep(0.2)
    answers = pool.advance([(doomed, a, 29, 0), (kept, one, 29, 0)], FAR)
    assert isinstance(answers[0][0], str) and "exited" in answers[0][0] and answers[1] == (ACCEPTED, [])
    again = pool.matcher(first)  # the grammar goes to the restarted worker
    assert pool.advance([(again, a, 30, 0), (doomed, a, 28, 0)], FAR)[0] == (ACCEPTED, [])


def test_workers_let_go_of_released_matchers_and_collected_grammars(smollm2_tokenizer, pool):
    grammars = [compile_grammar("regex", r"[a-z]{1,9}", smollm2_tokenizer),
                compile_grammar("json", {"type": "object", "properties": {"a": {"type": "integer"}}}, smollm2_tokenizer)]
    matchers = [pool.matcher(g) for g in grammars for _ in range(3)]
    assert sorted(pool.held()) == [(1, 3), (1, 3)]  # a grammar a worker, its matchers with it
    del matchers[1:]
    gc.collect()
    assert sum(m for _, m in pool.held()) == 1
    del matchers, grammars
    gc.collect()
    assert pool.held() == [(0, 0), (0, 0)]


def test_a_grammar_that_cannot_travel_is_unplaceable(smollm2_tokenizer, pool):
    """A custom grammar that does not pickle stays with the caller (the engine then keeps its
    matchers on its own thread)."""
    class Local:
        def __init__(self, grammar):
            self.grammar, self.lock = grammar, threading.Lock()

        def matcher(self):
            return self.grammar.matcher()

    with pytest.raises(Unplaceable, match="pickle"):
        pool.matcher(Local(compile_grammar("regex", "[a-z]+", smollm2_tokenizer)))
    assert pool.held() == [(0, 0), (0, 0)]


def test_a_worker_goes_on_with_a_parked_row_between_asks(smollm2_tokenizer, pool):
    """A row of 40 units parks under a 10 ms deadline; the worker finishes it while the engine is
    away, so the next ask, under the same deadline, gets it."""
    grammar = compile_grammar("regex", "[a-z]{3}", smollm2_tokenizer)
    matcher = pool.matcher(SlowRowGrammar(grammar, 40))
    out = np.zeros((1, bitmask_width(len(smollm2_tokenizer))), dtype=np.uint32)
    assert pool.fill_rows([(matcher, 100)], time.perf_counter() + 0.01, out) == [PARKED]
    time.sleep(40 * UNIT_S + 0.3)
    assert pool.fill_rows([(matcher, 100)], time.perf_counter() + 0.01, out) == [READY]
    assert np.array_equal(out[0], grammar.matcher().next_token_row(100).numpy().view(np.uint32))
