"""lexer_product: the C walk over the contextual lexer's product states builds the same lexer as
the Python reference, on JSON Schema grammars (exact: ties between terminals), on Lark grammars
(priorities, a lazy terminal) and on a product larger than the walk's first buffers."""
import random

import numpy as np
import pytest

from gdserve.grammar.cfg import lexer as lexer_module, lexer_product
from gdserve.grammar.cfg.lexer import Lexer, terminal_dfa
from gdserve.grammar.cfg.parser import LalrParser
from gdserve.grammar.json.schema_cfg import schema_to_grammar
from gdserve.grammar.cfg.lark_spec import lark_to_spec

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "names": {"type": "array", "items": {"type": "string"}},
    "nested": {"type": "object", "properties": {"n": {"type": "integer"}, "nn": {"type": "number"}}},
    "kind": {"enum": ["a", "ab", "abc"]}}}
LARK = r"""
start: (WORD | NUMBER | KEYWORD | COMMENT)+
KEYWORD.2: "if" | "in" | "int"
WORD: /[a-z]+/
NUMBER: /[0-9]+(\.[0-9]+)?/
COMMENT: /#.*?;/
%ignore " "
"""
LONG_PREFIX = r"""
start: AB | AC | AD
AB: /a{0,600}b/
AC: /a{0,600}c/
AD: /a{0,600}d/
"""


def specs():
    return [schema_to_grammar(SCHEMA, None, False, open_objects=True).spec(), lark_to_spec(LARK),
            lark_to_spec(LONG_PREFIX)]


def candidate_sets(spec, walks: int = 20, steps: int = 60) -> list[frozenset[int]]:
    """Every terminal, then the sets a parser meets on random walks (ignored terminals added)."""
    parser, rng = LalrParser(spec), random.Random(0)
    out = [frozenset(range(len(spec.terminals)))]
    for _ in range(walks):
        stack = parser.initial
        for _ in range(steps):
            ids = parser.acceptable(stack)
            out.append(ids | spec.ignore)
            if not ids:
                break
            stack = rng.choice(parser.feed(stack, spec.terminals[rng.choice(sorted(ids))].name))
    return out


def built(spec, sets) -> Lexer:
    lexer = Lexer(spec, [terminal_dfa(t) for t in spec.terminals])
    for candidates in sets:
        lexer.start(candidates)
    return lexer


@pytest.mark.skipif(lexer_product.mask_library() is None, reason="no C compiler: the reference is the only walk")
@pytest.mark.parametrize("which", range(3))
def test_native_walk_builds_the_reference_lexer(which, monkeypatch):
    spec = specs()[which]
    sets = candidate_sets(spec)
    native = built(spec, sets)
    monkeypatch.setattr(lexer_product, "mask_library", lambda: None)
    monkeypatch.setattr(lexer_module, "mask_library", lambda: None)  # the terminals' own rows too
    reference = built(spec, sets)
    assert native.num_states == reference.num_states
    (dfa_n, accept_n), (dfa_r, accept_r) = native.arrays(), reference.arrays()
    assert np.array_equal(dfa_n.trans, dfa_r.trans) and np.array_equal(accept_n, accept_r)
    assert [native.emitted(a) for a in accept_n] == [reference.emitted(a) for a in accept_r]


def lex(lexer: Lexer, start: int, data: bytes) -> int:
    state = start
    for b in data:
        state = lexer.step(state, b)
        if state < 0:
            return -1
    return state


@pytest.mark.parametrize("native", [True, False])
def test_a_product_past_the_first_buffers(native, monkeypatch):
    """Two terminals stay alive through 600 `a`s: 600 product states (the walk starts with room
    for 256, and knows 512 at first), each byte after them picks one. A candidate set with a
    third terminal adds its own states; the first set again adds only its start."""
    if not native:
        monkeypatch.setattr(lexer_product, "mask_library", lambda: None)
        monkeypatch.setattr(lexer_module, "mask_library", lambda: None)
    spec = lark_to_spec(LONG_PREFIX)
    lexer = Lexer(spec, [terminal_dfa(t) for t in spec.terminals])
    ids = {t.name: i for i, t in enumerate(spec.terminals)}
    two, three = frozenset([ids["AB"], ids["AC"]]), frozenset(ids.values())
    for candidates in (two, three):
        start = lexer.start(candidates)
        for n in (0, 1, 255, 256, 511, 512, 600):
            for t in sorted(candidates):
                last = spec.terminals[t].name[1].lower().encode()
                assert lexer.emits(lex(lexer, start, b"a" * n + last)) == (t,)
            assert lexer.emits(lex(lexer, start, b"a" * n)) == ()
        assert lex(lexer, start, b"a" * 601) == -1
    before = lexer.num_states
    lexer._starts.clear()  # a new start for the same set: its states after the first byte are known
    lexer.start(two)
    assert lexer.num_states == before + 1
