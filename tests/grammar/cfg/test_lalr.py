"""The LALR(1) tables of grammar/cfg/lalr.py: the same parser moves as lark's own LALR analyzer on the
built-in grammars and on JSON Schema grammars (random walks compare the terminals each stack can
take next), lark's conflict resolution (shift over reduce, rule priority, reduce/reduce refused),
and grammars big or deep enough to break a recursive implementation."""
import random

import pytest

from gdserve.grammar import GrammarError
from gdserve.grammar.cfg.parser import LalrParser
from gdserve.grammar.json.schema_cfg import schema_to_grammar
from gdserve.grammar.cfg.lalr import Rule, lalr_table
from gdserve.grammar.cfg.lark_spec import CfgSpec, Terminal, bnf_to_spec, lark_to_spec, load_grammar_text

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"}}},
     "required": ["a"]},
    {"$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
     "$ref": "#/$defs/node"},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "x"}, "v": {"type": "number"}}},
               {"type": "array", "maxItems": 3}, {"type": "null"}]},
]


def lark_table_spec(text: str) -> CfgSpec:
    """The same grammar through lark's own LALR analyzer (the reference)."""
    from lark.common import ParserConf
    from lark.load_grammar import load_grammar
    from lark.parsers.lalr_analysis import LALR_Analyzer
    grammar, _ = load_grammar(text, "<grammar>", [], False)
    terminals, rules, _ = grammar.compile(["start"], set())
    analysis = LALR_Analyzer(ParserConf(rules, {}, ["start"]))
    analysis.compute_lalr()
    table = analysis.parse_table
    actions = tuple({str(sym): (True, arg) if act.name == "Shift" else (False, (str(arg.origin.name), len(arg.expansion)))
                     for sym, (act, arg) in table.states[s].items()} for s in range(len(table.states)))
    ours = lark_to_spec(text)
    return CfgSpec(ours.terminals, ours.ignore, actions, table.start_states["start"], table.end_states["start"])


def assert_same_moves(ours: CfgSpec, theirs: CfgSpec, walks: int = 30, steps: int = 120) -> int:
    rng = random.Random(0)
    a, b = LalrParser(ours), LalrParser(theirs)
    names_a = [t.name for t in ours.terminals]
    names_b = [t.name for t in theirs.terminals]
    compared = 0
    for _ in range(walks):
        sa, sb = a.initial, b.initial
        for _ in range(steps):
            next_a = {names_a[i] for i in a.acceptable(sa)}
            assert next_a == {names_b[i] for i in b.acceptable(sb)}
            assert next_a == {name for name in names_a if a.feed(sa, name)}  # one feed each, the long way
            assert a.accepts_end(sa) == b.accepts_end(sb)
            compared += 1
            if not next_a:
                break
            name = rng.choice(sorted(next_a))
            (sa,), (sb,) = a.feed(sa, name), b.feed(sb, name)
    return compared


@pytest.mark.parametrize("name", ["json", "sql_select", "arithmetic", "function_call"])
def test_builtin_grammars_move_as_lark_tables(name):
    text = load_grammar_text(f"builtin:{name}")
    assert assert_same_moves(lark_to_spec(text), lark_table_spec(text)) > 50


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("open_objects", [False, True])
def test_schema_grammars_move_as_lark_tables(schema, open_objects):
    grammar = schema_to_grammar(schema, open_objects=open_objects)
    assert assert_same_moves(grammar.spec(), lark_table_spec(grammar.lark)) > 50


def test_shift_reduce_resolved_as_shift():
    """The dangling else: `else` binds to the nearest `if`, as lark resolves it."""
    text = 'start: "if" start | "if" start "else" start | "x"'
    spec = lark_to_spec(text)
    parser = LalrParser(spec)
    names = {t.regex: t.name for t in spec.terminals}
    stack = parser.initial
    for word in ["if", "if", "x", "else", "x"]:
        (stack,) = parser.feed(stack, names[word])
    assert parser.accepts_end(stack)
    assert assert_same_moves(spec, lark_table_spec(text)) > 10


def test_reduce_reduce_conflicts_refused_unless_priority_decides():
    with pytest.raises(GrammarError, match=r"Reduce/Reduce collision in \$END.*<a : X>.*<b : X>"):
        lalr_table([Rule("start", ("a",)), Rule("start", ("b",)), Rule("a", ("X",)), Rule("b", ("X",))], {"X"})
    table = lalr_table([Rule("start", ("a",)), Rule("start", ("b",)), Rule("a", ("X",), 2), Rule("b", ("X",))], {"X"})
    after_x = table.actions[table.actions[0]["X"][1]]
    assert after_x["$END"] == (False, ("a", 1))


def test_equivalent_rules_are_merged_before_the_table():
    """Copies of a rule (also mutually recursive ones) are one rule: no reduce/reduce conflict;
    rules that differ still collide."""
    for text in ('start: a | b\na: "x"\nb: "x"',
                 'start: a | b\na: "(" a ")" | "x"\nb: "(" b ")" | "x"'):
        spec = lark_to_spec(text)
        parser, names = LalrParser(spec), {t.regex: t.name for t in spec.terminals}
        stack = parser.initial
        for word in ["\\(", "\\(", "x", "\\)", "\\)"] if "(" in text else ["x"]:
            (stack,) = parser.feed(stack, names[word])
        assert parser.accepts_end(stack)
    with pytest.raises(GrammarError, match="Reduce/Reduce"):
        lark_to_spec('start: a | b\na: "(" a ")" | "x"\nb: "(" b ")" | "y" | "x"')


def test_exact_specs_keep_conflicts_and_follow_each_action():
    """a: X and b: X | X X, both before Y: a reduce/reduce conflict on Y. Refused by default; an
    exact spec keeps both reductions, so "X Y" parses two ways (then $END or Z) and "X X Y Z" one."""
    rules = [Rule("start", ("a", "Y")), Rule("start", ("b", "Y", "Z")), Rule("a", ("X",)),
             Rule("b", ("X",)), Rule("b", ("X", "X"))]
    terminals = tuple(Terminal(n, n.lower(), 0, True, False) for n in "XYZ")
    with pytest.raises(GrammarError, match="Reduce/Reduce"):
        bnf_to_spec(rules, terminals)
    spec = bnf_to_spec(rules, terminals, exact=True)
    parser = LalrParser(spec)
    (x,) = parser.feed(parser.initial, "X")
    both = parser.feed(x, "Y")
    assert len(both) == 2 and sorted(parser.accepts_end(s) for s in both) == [False, True]
    assert [parser.accepts_end(z) for s in both for z in parser.feed(s, "Z")] == [True]
    (xx,) = parser.feed(x, "X")
    (xxy,) = parser.feed(xx, "Y")
    assert not parser.accepts_end(xxy) and parser.acceptable(xxy) == {spec.terminal_ids["Z"]}


def test_undefined_symbols_and_missing_start_refused():
    with pytest.raises(GrammarError, match="'y' is used but not defined"):
        lalr_table([Rule("start", ("X", "y"))], {"X"})
    with pytest.raises(GrammarError, match="no rule 'start'"):
        lalr_table([Rule("other", ("X",))], {"X"})


def test_nullable_and_left_recursive_rules():
    """start: item* with nullable items and an empty alternative: the moves of lark's table."""
    text = 'start: start item | \nitem: "a" opt | "b"\nopt: "c" | '
    assert assert_same_moves(lark_to_spec(text), lark_table_spec(text)) > 20


def test_long_rule_chains_build_without_recursion():
    """5,000 chained rules (a deep includes/reads graph): the lookahead sets are built iteratively."""
    n = 5000
    rules = [Rule(f"r{i}", (f"r{i + 1}",)) for i in range(n)] + [Rule(f"r{n}", ("X",)), Rule(f"r{n}", ())]
    rules.append(Rule("start", ("r0", "Y")))
    spec = bnf_to_spec(rules, (Terminal("X", "x", 0, True, False), Terminal("Y", "y", 0, True, False)))
    parser = LalrParser(spec)
    (after_x,) = parser.feed(parser.initial, "X")
    assert [parser.accepts_end(s) for s in parser.feed(after_x, "Y")] == [True]
    assert [parser.accepts_end(s) for s in parser.feed(parser.initial, "Y")] == [True]
    assert parser.feed(parser.initial, "Z") == ()


def test_unreachable_rules_and_their_terminals_dropped():
    terminals = (Terminal("X", "x", 0, True, False), Terminal("U", "u", 0, True, False))
    spec = bnf_to_spec([Rule("start", ("X",)), Rule("unused", ("U",))], terminals)
    assert [t.name for t in spec.terminals] == ["X"]
