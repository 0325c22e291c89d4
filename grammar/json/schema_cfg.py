"""JSON Schema -> BNF grammar, for what no regex can hold: recursive schemas ($ref cycles through
objects or arrays: trees, linked lists, nested comments) and exact JSON of any depth (unconstrained
values, response_format json_object).

json.schema compiles the schema as for the regex path, except that a position reached again inside
itself becomes a rule, referred to by a placeholder (compile_json_schema_rules). Each regex is then
cut at its placeholders (regex.tree): the rule-free stretches of a sequence become terminals, the
structure around placeholders becomes plain BNF: each alternation, optional and repetition is a
helper rule (inline, as in EBNF, k of them would make 2^k copies of the enclosing expansion),
unbounded repetition left-recursive. A stretch that may match the empty string is written as its nonempty
form, made optional (a terminal is never empty). The grammar's language is the regex path's language with every placeholder
expanded, so the contract of json.schema (soundness, whitespace, key order) carries over.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.keys import expand_keys
from gdserve.grammar.json.schema import compile_json_schema_rules
from gdserve.grammar.cfg.lalr import Rule
from gdserve.grammar.cfg.lark_spec import TERMINAL_PRIORITY, CfgSpec, Terminal, bnf_to_spec
from gdserve.grammar.regex.tree import (Alt, Atom, ByteSizes, Node, Repeat, Seq, is_long_repeat, nonempty,
                                       nullable, parse, to_regex)

JSON_OBJECT_SCHEMA = {"type": "object"}  # response_format json_object: any JSON object
TERMINAL_MAX_SIZE = 6_000  # expanded atoms (regex.tree's node.size) of one terminal, ~its DFA states
SPLIT_REPEAT_MAX = 64       # a bigger bounded repetition stays one terminal (a rule chain per copy)


@dataclass
class JsonSchemaGrammar:
    rules: list[Rule]          # BNF, start rule `start`
    terminals: dict[str, str]  # name -> regex (outlines-core's dialect, with json.keys placeholders)
    relaxed: list[str]
    narrowed: list[str]
    max_open_bytes: int  # the longest shortest text of an optional part (what one token may open)
    unique_items: list[str]    # uniqueItems the matcher keeps (json.unique)

    def spec(self) -> CfgSpec:
        """Exact: the terminals are cuts of one regex, so every split and every parse of a text
        is the schema's (maximal munch and conflict resolution would refuse some)."""
        return bnf_to_spec(self.rules, tuple(Terminal(name, regex, TERMINAL_PRIORITY, False, False)
                                             for name, regex in self.terminals.items()), exact=True)

    @property
    def lark(self) -> str:
        """The same grammar as Lark text (tests parse it with lark's Earley parser)."""
        bodies: dict[str, list[str]] = {}
        for rule in self.rules:
            bodies.setdefault(rule.origin, []).append(" ".join(rule.expansion))
        lines = [f"{name}: {' | '.join(options)}" for name, options in bodies.items()]
        return "\n".join(lines + [f"{name}: /{_lark_regex(expand_keys(regex))}/"
                                  for name, regex in self.terminals.items()])


def schema_to_grammar(schema: dict | bool | str, whitespace_pattern: str | None = None,
                      lenient: bool = False, *, open_objects: bool = False) -> JsonSchemaGrammar:
    """The schema as BNF rules over regex terminals; GrammarError as json.schema raises."""
    compiled = compile_json_schema_rules(schema, whitespace_pattern, lenient, open_objects=open_objects)
    root, trees = parse(compiled.root), {name: parse(body) for name, body in compiled.rules.items()}
    writer = _BnfWriter()
    bodies = [("start", writer.rule_body(root))]
    bodies += [(name, writer.rule_body(tree)) for name, tree in trees.items()]
    bodies += [(name, body) for body, name in writer.helpers.items()]
    missing = writer.rules_used - set(compiled.rules)
    if missing:
        raise GrammarError(f"recursive schema: the cycle through rule {sorted(missing)[0]} matches no value")
    rules = [Rule(name, tuple(option.split())) for name, body in bodies
             for option in dict.fromkeys(body.split(" | "))]
    return JsonSchemaGrammar(rules, {name: regex for regex, name in writer.terminals.items()},
                             compiled.relaxed, compiled.narrowed, _max_open_bytes(root, trees),
                             compiled.unique_items)


def _max_open_bytes(root: Node, trees: dict[str, Node]) -> int:
    """The longest shortest text of an optional part, rules at their shortest texts in bytes."""
    sizes = ByteSizes(trees)
    return max(sizes.max_optional_bytes(t) for t in [root, *trees.values()])


class _BnfWriter:
    def __init__(self):
        self.terminals: dict[str, str] = {}  # regex -> terminal name
        self.rules_used: set[str] = set()
        self.helpers: dict[str, str] = {}  # body -> name of the alternation/repetition rules
        self.stars: dict[str, str] = {}    # item -> name of its `item*` rule
        # to_regex by id(node); the nodes the writer makes itself are kept in `made` so that no id
        # is reused while it writes
        self.texts: dict[int, str] = {}
        self.made: list[Node] = []

    def rule_body(self, tree: Node) -> str:
        """A rule's body; an alternation (maybe optional) of rule-bearing options is written as the
        rule's own alternatives, not through a helper rule (half the rules of an open object's
        A_s rules, and of lark's LALR work)."""
        optional = isinstance(tree, Repeat) and (tree.lo, tree.hi) == (0, 1)
        inner = tree.item if optional else tree
        if isinstance(inner, Alt) and self._structural(inner):
            body = " | ".join(dict.fromkeys([self.expr(o) for o in inner.options] + [""] * optional))
        else:
            body = self.expr(tree)
        if not body:
            raise GrammarError("recursive schema: a rule matches only the empty text")
        return body

    def expr(self, node: Node) -> str:
        """BNF for node: symbols separated by spaces ("" for the empty text). Alternations,
        optionals and repetitions become rules of their own. A rule-free node too big for one
        terminal's DFA is written the same way (its parts become terminals)."""
        if not self._structural(node):
            return self.terminal(node)
        if isinstance(node, Atom):
            self.rules_used.add(node.rule)
            return node.rule
        if isinstance(node, Seq):
            runs = _runs(node.items, self._apart)
            self.made += runs
            if runs == [node]:  # big, but no part is written as rules: cut into terminals
                return " ".join(p for p in map(self.expr, self._chunks(node)) if p)
            written = (self.terminal(n) if closed else self.expr(n) for n, closed in self._closed(runs))
            return " ".join(p for p in written if p)
        if isinstance(node, Alt):
            return self._helper(list(dict.fromkeys(self.expr(o) for o in node.options)))
        item = self.expr(node.item)
        return self._repeat(item, node.lo, node.hi) if item else ""

    def _structural(self, node: Node) -> bool:
        """Whether node is written as rules: it holds one, or it is too big for one terminal
        (a map of 64 string pairs: 10^6 DFA states) and splits (a sequence, an alternation, a
        repetition of at most SPLIT_REPEAT_MAX items), or it holds a long repetition (a string's
        maxLength), which starts a terminal of its own (with what closes it, _closed): one DFA
        shared by every key whose value it is, built from its item's (cfg.lexer), where inside
        each key's terminal it would be thousands of states per key."""
        if node.rules:
            return True
        if isinstance(node, Atom) or (isinstance(node, Repeat) and node.hi is not None
                                      and node.hi - node.lo > SPLIT_REPEAT_MAX):
            return False
        return node.size > TERMINAL_MAX_SIZE or (node.long and not is_long_repeat(node))

    def _apart(self, node: Node) -> bool:
        """Whether a sequence's item is written on its own (not joined with its neighbours)."""
        return self._structural(node) or is_long_repeat(node)

    def _closed(self, runs: list[Node]) -> list[tuple[Node, bool]]:
        """The runs, a long repetition joined with the run after it where that run starts with a
        required part (a string's closing quote), as (node, one terminal). Tokens that end the
        string (`abc"`) then stay inside one terminal; apart, they would cross into the next
        terminal from every count state the string reaches, each a parser step on first visit."""
        out: list[tuple[Node, bool]] = []
        for run in runs:
            if (out and is_long_repeat(out[-1][0]) and isinstance(run, Seq) and not self._apart(run)
                    and run.items and not nullable(run.items[0])):
                joined = Seq((out[-1][0], *run.items))
                self.made.append(joined)
                out[-1] = (joined, True)
            else:
                out.append((run, False))
        return out

    def _chunks(self, node: Seq) -> list[Node]:
        """The items of a big rule-free sequence in consecutive runs of at most TERMINAL_MAX_SIZE
        each (an item bigger than that alone): an object of many small optional members is one
        terminal per few members, not one DFA of all (any cut is the same language: the spec is
        exact)."""
        out, run, size = [], [], 0
        for item in node.items:
            if run and size + item.size > TERMINAL_MAX_SIZE:
                out.append(Seq(tuple(run)) if len(run) > 1 else run[0])
                run, size = [], 0
            run.append(item)
            size += item.size
        out.append(Seq(tuple(run)) if len(run) > 1 else run[0])
        self.made += out
        return out

    def _repeat(self, item: str, lo: int, hi: int | None) -> str:
        """item repeated lo..hi times: the required copies, then a left-recursive rule for an
        unbounded rest, or a chain of optional rules for a bounded one."""
        rest = ""
        if hi is None:
            rest = self.stars.get(item, "")
            if not rest:
                rest = self.stars[item] = f"_h{len(self.helpers)}"
                self.helpers[f"{rest} {item} | "] = rest
        else:
            for _ in range(hi - lo):
                rest = self._helper([f"{item} {rest}".strip(), ""])
        return " ".join([item] * lo + ([rest] if rest else []))

    def _helper(self, options: list[str]) -> str:
        """A rule whose alternatives are options ("" an empty one); one per distinct body."""
        body = " | ".join(options) if options != [""] else ""
        if not body.strip():
            return ""
        name = self.helpers.setdefault(body, f"_h{len(self.helpers)}")
        return name

    def terminal(self, node: Node) -> str:
        if nullable(node):
            whole = nonempty(node)
            self.made.append(whole)
            if isinstance(node, Seq) and whole is not None and whole.size > TERMINAL_MAX_SIZE:
                # a run of optional parts: its nonempty form repeats each part's followers
                return " ".join(p for p in map(self.terminal, node.items) if p)
            return "" if whole is None else self._helper([self.terminal(whole), ""])
        regex = to_regex(node, self.texts)
        name = self.terminals.setdefault(regex, f"T{len(self.terminals)}")
        return name


def _runs(items: tuple, apart) -> list[Node]:
    """A sequence's items with each stretch of items not written apart joined into one."""
    out, run = [], []
    for item in items:
        if apart(item):
            if run:
                out.append(Seq(tuple(run)))
                run = []
            out.append(item)
        else:
            run.append(item)
    if run:
        out.append(Seq(tuple(run)))
    return out


_ESCAPE_OR_SLASH = re.compile(r"\\(?:x\{([0-9a-fA-F]+)\}|u\{([0-9a-fA-F]+)\}|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})"
                              r"|U([0-9a-fA-F]{8})|.)|/", re.S)


def _lark_regex(regex: str) -> str:
    """The regex as the body of lark's /.../, which lark reads as a Python string literal
    (`\\x5c` would arrive as a bare backslash): printable ASCII escapes are written as the
    character (escaped if punctuation), other code points as \\U escapes (they arrive as the
    character itself, which no regex reads as syntax), slashes as \\/."""
    def fix(m: re.Match) -> str:
        if m.group() in ("/", "\\/"):
            return "\\/"
        hex_digits = next((g for g in m.groups() if g), None)
        if hex_digits is None:
            return m.group()
        c = chr(int(hex_digits, 16))
        if " " <= c <= "~":
            return c if c.isalnum() or c == " " else "\\" + c
        return f"\\U{ord(c):08x}"
    return _ESCAPE_OR_SLASH.sub(fix, regex)
