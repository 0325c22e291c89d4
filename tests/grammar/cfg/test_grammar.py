"""Kind "grammar" (Lark EBNF, GBNF, builtin:NAME) on SmolLM2's vocabulary: random sentences of each
built-in grammar are accepted token by token under several tokenizations and then allow EOS,
mutants lark rejects are rejected, rollback restores exactly, masks agree with the slow oracle
(grammar/cfg/oracle.py) and with accept_token, and compile errors name the problem."""
import pickle
import random

import lark
import numpy as np
import pytest
import torch

from gdserve.grammar import GrammarError, compile_grammar
from gdserve.grammar.cfg.oracle import LarkOracle, oracle_walk
from gdserve.grammar.cfg.sample import SentenceSampler
from gdserve.grammar.cfg.lark_spec import lark_to_spec, load_grammar_text
from tests.grammar.walk import (accepts_all, allowed_ids, random_split, single_byte_ids, token_ids_by_bytes,
                                tokenized_mutants)

BUILTINS = ["json", "sql_select", "arithmetic", "function_call"]
_COMPILED: dict = {}


def grammar_of(tokenizer, spec: str):
    if spec not in _COMPILED:
        _COMPILED[spec] = compile_grammar("grammar", spec, tokenizer)
    return _COMPILED[spec]


def sentences(name: str, count: int, seed: int = 0) -> list[str]:
    sampler, rng = SentenceSampler(load_grammar_text(f"builtin:{name}")), random.Random(seed)
    return [sampler.sentence(rng) for _ in range(count)]


@pytest.mark.parametrize("name", BUILTINS)
def test_sentences_accepted_under_several_tokenizations(smollm2_tokenizer, name):
    g = grammar_of(smollm2_tokenizer, f"builtin:{name}")
    rng, by_bytes = random.Random(1), token_ids_by_bytes(g)
    for text in sentences(name, 8):
        data = text.encode()
        canonical = smollm2_tokenizer.encode(text, add_special_tokens=False)
        singles = {bytes([b]): t for b, t in single_byte_ids(g).items()}
        splits = [canonical, random_split(data, singles, rng),
                  random_split(data, by_bytes, rng), random_split(data, by_bytes, rng)]
        for ids in splits:
            if ids and b"".join(g.token_data(t) for t in ids) == data:  # lossy tokenizing
                assert accepts_all(g, ids), (text, [g.token_data(t) for t in ids])


@pytest.mark.parametrize("name", BUILTINS)
def test_mutants_rejected_exactly_when_lark_rejects(smollm2_tokenizer, name):
    g = grammar_of(smollm2_tokenizer, f"builtin:{name}")
    parser, rng = lark.Lark(load_grammar_text(f"builtin:{name}"), parser="lalr"), random.Random(2)
    rejected = 0
    for mutant, ids in tokenized_mutants(smollm2_tokenizer, g, sentences(name, 25, seed=3), rng):
        try:
            parser.parse(mutant)
            valid = True
        except lark.exceptions.LarkError:
            valid = False
        rejected += not valid
        assert accepts_all(g, ids) == valid, mutant
    assert rejected >= 5


@pytest.mark.parametrize("name", BUILTINS)
def test_rollback_restores_state_and_mask(smollm2_tokenizer, name):
    g = grammar_of(smollm2_tokenizer, f"builtin:{name}")
    rng = random.Random(4)
    for text in sentences(name, 4, seed=5):
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        if b"".join(g.token_data(t) for t in ids) != text.encode():
            continue
        m = g.matcher()
        states, masks = [m.state], [allowed_ids(m)]
        for t in ids:
            assert m.accept_token(t)
            states.append(m.state)
            masks.append(allowed_ids(m))
        while len(states) > 1:
            n = rng.randint(1, len(states) - 1)
            m.rollback(n)
            del states[-n:], masks[-n:]
            assert m.state == states[-1] and allowed_ids(m) == masks[-1]
        with pytest.raises(ValueError):
            m.rollback(1)


@pytest.mark.parametrize("name", BUILTINS)
def test_masks_agree_with_slow_oracle(smollm2_tokenizer, name):
    g = grammar_of(smollm2_tokenizer, f"builtin:{name}")
    text = load_grammar_text(f"builtin:{name}")
    guides = [smollm2_tokenizer.encode(s, add_special_tokens=False) for s in sentences(name, 10)]
    report = oracle_walk(g, LarkOracle(text), guides, random.Random(6), steps=120, sample=20)
    assert report.checked > 3000
    assert report.wrong == []


def test_sequences_that_meet_a_state_share_it(smollm2_tokenizer):
    """A second sequence over the same tokens reaches equal states as the same objects (each token
    from a state is read once per grammar), through rollbacks too."""
    g = compile_grammar("grammar", "builtin:json", smollm2_tokenizer)
    ids = smollm2_tokenizer.encode('{"a": [1, 2.5, "x"], "b": null}', add_special_tokens=False)
    first, second = g.matcher(), g.matcher()
    for t in ids:
        assert first.accept_token(t) and second.accept_token(t)
        assert first.state is second.state
    assert second.accept_token(smollm2_tokenizer.eos_token_id)
    second.rollback(2)  # EOS and the last token
    assert second.accept_token(ids[-1]) and second.state is first.state


def test_mask_is_exactly_the_accepted_tokens(smollm2_tokenizer):
    """Over the whole vocabulary at a few states: a bit is set iff accept_token succeeds."""
    g = grammar_of(smollm2_tokenizer, "builtin:json")
    m = g.matcher()
    for t in smollm2_tokenizer.encode('{"a": [1, "x\\n", {"b": null}', add_special_tokens=False):
        allowed = allowed_ids(m) - g.eos_token_ids
        ok = {c for c in range(g.vocab_size) if g.token_data(c) and g.advance(m.state, g.token_data(c))}
        assert allowed == ok
        assert m.accept_token(t)


def test_json_builtin_matches_json(smollm2_tokenizer):
    g = grammar_of(smollm2_tokenizer, "builtin:json")
    for text, ok in [('{"a": 1, "b": [true, false, null], "c": {"d": "e\\u00e9"}}', True),
                     ("[1, 2.5e-3, -0]", True), ('"x"', True), ("01", False), ("[1,]", False),
                     ('{"a" 1}', False), ("{'a': 1}", False), ('"tab\there"', False)]:
        assert accepts_all(g, smollm2_tokenizer.encode(text, add_special_tokens=False)) == ok, text


def test_eos_only_at_complete_lexeme_and_accepting_parser(smollm2_tokenizer):
    g = compile_grammar("grammar", 'start: NUMBER ("," NUMBER)*\nNUMBER: /[0-9]+/\n%ignore " "',
                        smollm2_tokenizer)
    m = g.matcher()
    eos = min(g.eos_token_ids)
    assert eos not in allowed_ids(m)
    for piece, eos_ok in [("1", True), ("2", True), (",", False), (" ", False), ("3", True),
                          (" ", True)]:
        assert m.accept_token(smollm2_tokenizer.convert_tokens_to_ids(piece.replace(" ", "Ġ")))
        assert (eos in allowed_ids(m)) == eos_ok, piece
    assert m.accept_token(eos) and m.is_terminated() and not m.accept_token(eos)


def test_terminated_when_only_eos_can_follow(smollm2_tokenizer):
    g = compile_grammar("grammar", 'start: "yes" | "no"', smollm2_tokenizer)
    m = g.matcher()
    assert m.accept_token(smollm2_tokenizer.convert_tokens_to_ids("yes"))
    assert m.is_terminated() and allowed_ids(m) == set(g.eos_token_ids)


def test_common_imports_and_lazy_terminals(smollm2_tokenizer):
    spec = ("start: (ESCAPED_STRING | C_COMMENT | SIGNED_NUMBER)+\n"
            "%import common (ESCAPED_STRING, C_COMMENT, SIGNED_NUMBER, WS)\n%ignore WS")
    g = compile_grammar("grammar", spec, smollm2_tokenizer)
    enc = lambda s: smollm2_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert accepts_all(g, enc('"a\\"b" /* x * y */ -1.5e3 "c"'))
    assert not accepts_all(g, enc('/* a */ b */'))     # the comment ends at its first */
    assert not accepts_all(g, enc('"a" b"'))


def test_gbnf_grammar(smollm2_tokenizer):
    gbnf = r'''
# a list of small records
root   ::= "[" ws item ("," ws item)* ws "]"
item   ::= name ws "=" ws number
name   ::= [a-z] [a-z0-9_]*
number ::= "-"? [0-9]+
ws     ::= [ ]*
'''
    g = compile_grammar("grammar", gbnf, smollm2_tokenizer)
    enc = lambda s: smollm2_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert accepts_all(g, enc("[a = 1, b_2=-30]"))
    assert accepts_all(g, enc("[x=0]"))
    assert not accepts_all(g, enc("[A=1]"))
    assert not accepts_all(g, enc("[a=1,]"))


def test_builtin_by_name_and_errors(smollm2_tokenizer):
    with pytest.raises(GrammarError, match="unknown built-in grammar.*builtin:json"):
        compile_grammar("grammar", "builtin:nope", smollm2_tokenizer)
    with pytest.raises(GrammarError, match="non-empty string"):
        compile_grammar("grammar", "", smollm2_tokenizer)
    with pytest.raises(GrammarError, match="line 2"):
        compile_grammar("grammar", 'start: "a"\nb: : "c"', smollm2_tokenizer)
    with pytest.raises(GrammarError, match="Reduce/Reduce|Shift/Reduce"):
        compile_grammar("grammar", 'start: a | b\na: "x" c\nb: "x" d\nc: "y"\nd: "y" | "y" "y"', smollm2_tokenizer)
    with pytest.raises(GrammarError, match="lookaround"):
        compile_grammar("grammar", 'start: A\nA: /a(?=b)/', smollm2_tokenizer)


@pytest.mark.parametrize("statement", ["%import .secret (S)", "%import secret (S)", "%import tmp.secret (S)",
                                       "%import .common.NUMBER -> S"])
def test_imports_reach_only_lark_grammars(tmp_path, monkeypatch, statement):
    """A %import never reads a file: not one beside the working directory, where lark looks."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.lark").write_text('S: "s"')
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "secret.lark").write_text('S: "s"')
    with pytest.raises(GrammarError, match="only lark's own grammars"):
        lark_to_spec(f"{statement}\nstart: S")
    assert [t.name for t in lark_to_spec("%import common.NUMBER\nstart: NUMBER").terminals] == ["NUMBER"]


@pytest.mark.parametrize("name", BUILTINS)
def test_a_grammar_pickled_midway_masks_and_grows_as_the_original(smollm2_tokenizer, name):
    """Pickled after its lexer has grown (its tables are cut to the states in use), the copy's
    rows equal the original's on random walks that reach states neither has built yet."""
    g = compile_grammar("grammar", f"builtin:{name}", smollm2_tokenizer)
    rng = random.Random(3)
    for text in sentences(name, 2, seed=5):
        m = g.matcher()
        for t in smollm2_tokenizer.encode(text, add_special_tokens=False):
            assert m.accept_token(t)
    copy = pickle.loads(pickle.dumps(g))
    assert len(copy.lexer._table) <= len(g.lexer._table)
    for _ in range(4):
        m, m2 = g.matcher(), copy.matcher()
        for _ in range(30):
            allowed = allowed_ids(m)
            assert allowed == allowed_ids(m2)
            real = sorted(allowed - g.eos_token_ids)
            if not real:
                break
            t = rng.choice(real)
            assert m.accept_token(t) and m2.accept_token(t)


def test_compile_service_compiles_grammars(smollm2_tokenizer):
    from gdserve.grammar.service import CompileService
    with CompileService(smollm2_tokenizer, timeout_s=60) as service:
        g = service.compile("grammar", "builtin:function_call")
        assert service.submit("grammar", "builtin:function_call").result() is g
        with pytest.raises(GrammarError, match="invalid Lark grammar"):
            service.compile("grammar", "start: ???")
    ids = smollm2_tokenizer.encode('get_weather(city="Paris", days=3)', add_special_tokens=False)
    assert accepts_all(g, ids)
    local = grammar_of(smollm2_tokenizer, "builtin:function_call")
    assert np.all(g.state_mask(g.initial).row.numpy() == local.state_mask(local.initial).row.numpy())


@pytest.mark.parametrize("name", BUILTINS)
def test_budget_steers_random_walks_to_completion(smollm2_tokenizer, name):
    """Uniformly random allowed tokens under the engine's budget (max_tokens - emitted - 2) still
    end with EOS within max_tokens."""
    g = grammar_of(smollm2_tokenizer, f"builtin:{name}")
    rng, eos, max_tokens = random.Random(7), min(g.eos_token_ids), 48
    bitmask = np.zeros((1, (g.vocab_size + 31) // 32), dtype=np.int32)
    for _ in range(4):
        m = g.matcher()
        for used in range(max_tokens):
            rows = torch.from_numpy(bitmask)
            m.fill_next_token_bitmask(rows, 0, budget=max_tokens - used - 2)
            bits = np.unpackbits(rows[0].numpy().view(np.uint8), bitorder="little")
            token = rng.choice(np.flatnonzero(bits[:g.vocab_size]).tolist())
            assert m.accept_token(token)
            if token == eos:
                break
        assert m.is_terminated(), (name, used)
