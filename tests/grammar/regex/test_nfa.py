"""The regex path's DFA (regex.nfa's NFA determinized in C) has the language and the distances of
outlines-core's DFA for the same pattern: on hand-picked syntax, on the regexes of the example
schemas and a sample of MaskBench's, and on syntax it leaves to outlines-core."""
import json
import random
from pathlib import Path

import numpy as np
import pytest

from gdserve.grammar import token_index
from gdserve.grammar.regex import tree as rt
from gdserve.grammar.regex.nfa import TooManyNodes, Unsupported, build_nfa, expanded_size
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.schema import compile_json_schema
from gdserve.grammar.token_index import build_byte_dfa, determinize, indexed_pattern, mask_library, outlines_byte_dfa

from tests.grammar.dfa_check import equivalent
from tests.grammar.json.test_schema import MASKBENCH
from tests.grammar.regex.nfa_oracle import oracle_nfa, utf8_sequences

SCHEMAS = Path(__file__).parents[3] / "schemas"
REGEXES = [r"a|ab", r"(a?)*b{2,4}", r"x{2,}y|x{0}", r"", r"(|a)(b|)", r".", r"[^\"\\\x00-\x1f]{0,5}",
           r"é[^a]{2,5}x", r"[\u4e00-\u9fff]+", r"\x{1F600}|\u00e9|\U0001F601", r"[-a-c\]\^]+",
           r"[^\x00-\x7f]", r"(ab|cd){0,3}e*", r"\{\n?[ ]{0,4}\"a\":[ ]?(true|false|null)\}",
           r"\.\*\+\?\(\)\[\]\{\}\|\$\^\/", r"[\t\n\r\f\v\a]", r"((a|b){2}c?)+", r"[^\x{10000}-\x{10FFFF}]"]
FALLBACK = [r"\d+", r"(?i:ab)", r"[[:alpha:]]+", r"[a-z&&[^aeiou]]", r"\p{L}", r"\w\s"]


def same_dfa(regex: str) -> None:
    pattern = indexed_pattern(regex)
    ours, theirs = build_byte_dfa(pattern), outlines_byte_dfa(pattern)
    assert equivalent(ours, theirs), regex
    assert same_distances(ours, theirs), regex


def same_distances(a, b) -> bool:
    """Every reachable pair of states (a's, b's after the same bytes) has one distance."""
    joint = sorted(set(zip(a.classes.tolist(), b.classes.tolist())))
    seen, todo = {(a.start, b.start)}, [(a.start, b.start)]
    while todo:
        x, y = todo.pop()
        if a.distance[x] != b.distance[y]:
            return False
        for ca, cb in joint:
            pair = (int(a.trans[x, ca]), int(b.trans[y, cb]))
            if pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return True


@pytest.fixture(autouse=True, scope="module")
def native():
    if mask_library() is None:
        pytest.skip("no native kernels: the regex path keeps outlines-core's DFA")


@pytest.mark.parametrize("regex", REGEXES)
def test_dialect_matches_outlines(regex):
    build_nfa(indexed_pattern(regex))  # read, not left to outlines-core
    same_dfa(regex)


@pytest.mark.parametrize("regex", FALLBACK)
def test_other_syntax_falls_back_to_outlines(regex):
    with pytest.raises(Unsupported):
        build_nfa(indexed_pattern(regex))
    same_dfa(regex)


def test_invalid_regex_still_raises():
    with pytest.raises(ValueError):
        build_byte_dfa(indexed_pattern("a{2,1}"))
    with pytest.raises(ValueError):
        build_byte_dfa(indexed_pattern("(ab"))


def test_utf8_sequences_cover_each_scalar_once():
    ranges = [(0, 0x10FFFF)]
    seqs = utf8_sequences(ranges)
    for cp in [0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF]:
        data = chr(cp).encode()
        hits = [s for s in seqs if len(s) == len(data) and all(lo <= b <= hi for b, (lo, hi) in zip(data, s))]
        assert len(hits) == 1, hex(cp)
    surrogate = "\ud800".encode("utf-8", "surrogatepass")
    assert not any(len(s) == 3 and all(lo <= b <= hi for b, (lo, hi) in zip(surrogate, s)) for s in seqs)


def schema_regexes() -> list[tuple[str, str]]:
    files = sorted(SCHEMAS.glob("*.json"))
    out = [(f.name, json.loads(f.read_text())) for f in files]
    if MASKBENCH.is_dir():
        out += [(f.name, json.loads(f.read_text())["schema"]) for f in sorted(MASKBENCH.glob("*.json"))[::60]]
    regexes = []
    for name, schema in out:
        try:
            regex = compile_json_schema(schema, None, False).regex
        except GrammarError:
            continue  # the grammar path's (recursive or too large)
        if len(regex) <= 8_000:  # outlines-core's side of the comparison takes seconds beyond
            regexes.append((name, regex))
    return regexes


def test_schema_regexes_match_outlines():
    regexes = schema_regexes()
    assert len(regexes) >= 30
    for name, regex in regexes:
        build_nfa(indexed_pattern(regex))
        same_dfa(regex)


def test_distances_are_exact_on_every_state(monkeypatch):
    regex = r"\{\"a\":(-?[0-9]{1,3}|\"[^\"]{2,4}\")(,\"b\":(true|false))?\}"
    ours = build_byte_dfa(indexed_pattern(regex))
    fresh = type(ours)(ours.classes, ours.trans, ours.final, ours.start)  # distances by the table's sweep
    assert np.array_equal(ours.distance, fresh.distance)
    monkeypatch.setattr(token_index, "mask_library", lambda: None)
    in_numpy = type(ours)(ours.classes, ours.trans, ours.final, ours.start)
    assert np.array_equal(ours.distance, in_numpy.distance)


def test_native_construction_builds_the_oracles_nfa():
    """nfa_build.c's NFA has the Python construction's node and edge counts and its language (the
    same subset construction from both), on the dialect and on the schemas' regexes (bounded
    repetitions of big subtrees among them)."""
    lib = mask_library()
    for regex in REGEXES + [regex for _, regex in schema_regexes()][:40]:
        pattern = indexed_pattern(regex)
        ours, oracle = build_nfa(pattern), oracle_nfa(pattern)
        assert (ours.num_nodes, len(ours.eps_to), len(ours.edge_to)) == \
            (oracle.num_nodes, len(oracle.eps_to), len(oracle.edge_to)), regex
        assert np.array_equal(ours.class_of, oracle.class_of), regex
        assert equivalent(determinize(lib, ours), determinize(lib, oracle)), regex


def test_too_many_nodes_is_refused_by_size():
    with pytest.raises(TooManyNodes):
        build_nfa(indexed_pattern("([a-z]{1,500}){1,10000}"))


_PIECES = ["a", "é", "\\n", "\\x41", "\\u00e9", "\\x{1F600}", ".", "[a-c]", "[^a]", "[]a]", "[^]b]", "[-a]", "[a-]",
           "[\\]]", "[^\\x00-\\x{10FFFF}]", "\\.", "\\-", "}", "]"]
_ODD = ["\\d", "^", "$", "\\b", "[a--b]", "\\ ", "\\x4", "\\u{}", "\\x{110000}", "\\uD800", "\\z", "\\", "(?i:a)",
        "[[a]]", "\ue000x\ue001", "[a"]
_QUANTIFIERS = ["", "", "", "*", "+", "?", "{2}", "{1,3}", "{0,}", "{,2}", "{,}"]
_ODD_QUANTIFIERS = ["{}", "{3,1}", "*?", "{2}+", "{a}", "{1", "??"]


def _random_regex(rng, depth: int = 0) -> str:
    out = []
    for _ in range(rng.randint(0, 4)):
        if rng.random() < 0.2 and depth < 3:
            options = "|".join(_random_regex(rng, depth + 1) for _ in range(rng.randint(1, 3)))
            out.append(rng.choice(["(", "(?:"]) + options + ")")
        else:
            out.append(rng.choice(_PIECES) if rng.random() < 0.85 else rng.choice(_ODD))
        out.append(rng.choice(_QUANTIFIERS) if rng.random() < 0.9 else rng.choice(_ODD_QUANTIFIERS))
    if rng.random() < 0.05:
        out.append(rng.choice(")(|"))
    return "".join(out)


def test_native_parse_reads_what_the_python_parse_reads():
    """On random regexes of the dialect and of syntax beside it, the native parse refuses what
    the Python parse (the oracle's) refuses, and otherwise builds the oracle's NFA; its expanded
    size is regex.tree's."""
    rng, lib, both = random.Random(0), mask_library(), 0
    for _ in range(600):
        regex = _random_regex(rng)
        pattern = indexed_pattern(regex) if rng.random() < 0.8 else regex + rng.choice(["\\z", "", "\\\\z", "|a\\z"])
        try:
            ours = build_nfa(pattern)
        except Unsupported:
            ours = None
        try:
            oracle = oracle_nfa(pattern)
        except Unsupported:
            oracle = None
        assert (ours is None) == (oracle is None), pattern
        if ours is None:
            continue
        both += 1
        assert (ours.num_nodes, len(ours.eps_to), len(ours.edge_to)) == \
            (oracle.num_nodes, len(oracle.eps_to), len(oracle.edge_to)), pattern
        assert equivalent(determinize(lib, ours), determinize(lib, oracle)), pattern
        assert expanded_size(regex) == rt.parse(regex).size, regex
    assert both > 200


def test_expanded_size_of_schema_regexes():
    for name, regex in schema_regexes():
        assert expanded_size(regex) == rt.parse(regex).size, name
