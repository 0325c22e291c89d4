"""Regexes as trees, for the regexes json_schema writes (outlines-core's dialect) with rule
placeholders in them: parse, print back, and the two operations json_schema_cfg needs to cut a
regex into grammar terminals: `nullable` (matches the empty string) and `nonempty` (the same
language without the empty string).

A placeholder `RULE_OPEN name RULE_CLOSE` (two private-use characters, which the generated
regexes never contain raw: they write non-ASCII as escapes) is an atom standing for a rule.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.regex import _class_end

RULE_OPEN, RULE_CLOSE = "\ue000", "\ue001"


def placeholder(name: str) -> str:
    return f"{RULE_OPEN}{name}{RULE_CLOSE}"


@dataclass(frozen=True)
class Atom:
    text: str   # a character, an escape, a class, `.`, or an opaque flag group

    @property
    def rule(self) -> str | None:
        return self.text[1:-1] if self.text.startswith(RULE_OPEN) else None


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class Alt:
    options: tuple


@dataclass(frozen=True)
class Repeat:
    item: object
    lo: int
    hi: int | None  # None: unbounded


Node = Atom | Seq | Alt | Repeat
EMPTY = Seq(())


def parse(text: str) -> Node:
    node, i = _Parser(text).alternation(0)
    if i != len(text):
        raise GrammarError(f"internal: unbalanced ')' at {i} in a generated regex")
    return node


def to_regex(node: Node) -> str:
    if isinstance(node, Atom):
        return node.text
    if isinstance(node, Seq):
        return "".join(f"(?:{to_regex(x)})" if isinstance(x, Alt) else to_regex(x) for x in node.items)
    if isinstance(node, Alt):
        return "|".join(to_regex(o) for o in node.options)
    inner = to_regex(node.item)
    if not isinstance(node.item, Atom):
        inner = f"(?:{inner})"
    return inner + _quantifier(node.lo, node.hi)


def has_rule(node: Node) -> bool:
    if isinstance(node, Atom):
        return node.rule is not None
    if isinstance(node, Repeat):
        return has_rule(node.item)
    return any(map(has_rule, node.items if isinstance(node, Seq) else node.options))


def nullable(node: Node) -> bool:
    if isinstance(node, Atom):
        return False
    if isinstance(node, Seq):
        return all(map(nullable, node.items))
    if isinstance(node, Alt):
        return any(map(nullable, node.options))
    return node.lo == 0 or nullable(node.item)


def nonempty(node: Node) -> Node | None:
    """The language of node minus the empty string; None if that is empty."""
    if not nullable(node):
        return node
    if isinstance(node, Seq):
        if not node.items:
            return None
        head, rest = node.items[0], Seq(node.items[1:])
        options = []
        if (h := nonempty(head)) is not None:
            options.append(Seq((h, *rest.items)))
        if (r := nonempty(rest)) is not None:
            options.append(r)  # head nullable here (the sequence is)
        return _alt(options)
    if isinstance(node, Alt):
        return _alt([o for o in map(nonempty, node.options) if o is not None])
    item = nonempty(node.item)  # a nonempty repetition starts with a nonempty item
    if item is None or node.hi == 1:
        return item
    return Seq((item, Repeat(node.item, 0, None if node.hi is None else node.hi - 1)))


class ByteSizes:
    """Fewest UTF-8 bytes of nodes (a class or `.` counts 1; a rule counts rules[name], which the
    caller may lower between calls, as a fixpoint over recursive rules does) and the longest
    shortest text of an optional or repeated part of a node (an alternative, a repetition's item:
    what one token may commit to once it takes that part). Rule-free nodes are sized once."""

    def __init__(self):
        self.rules: dict[str, int] = {}
        self._fixed: dict[int, tuple[int, int, bool]] = {}  # id(node) -> sizes, nodes without rules

    def min_bytes(self, node: Node) -> int:
        return self._sizes(node)[0]

    def max_optional_bytes(self, node: Node) -> int:
        return self._sizes(node)[1]

    def _sizes(self, node: Node) -> tuple[int, int, bool]:
        """(min bytes, max optional bytes, holds a rule)."""
        out = self._fixed.get(id(node))
        if out is not None:
            return out
        if isinstance(node, Atom):
            if node.rule is not None:
                return self.rules[node.rule], 0, True
            out = _atom_bytes(node.text), 0, False
        elif isinstance(node, Seq):
            sizes = [self._sizes(x) for x in node.items]
            out = (sum(m for m, _, _ in sizes), max((o for _, o, _ in sizes), default=0),
                   any(r for _, _, r in sizes))
        elif isinstance(node, Alt):
            sizes = [self._sizes(o) for o in node.options]
            out = (min(m for m, _, _ in sizes), max(max(m, o) for m, o, _ in sizes),
                   any(r for _, _, r in sizes))
        else:
            m, o, r = self._sizes(node.item)
            out = node.lo * m, max(m, o), r
        if not out[2]:
            self._fixed[id(node)] = out
        return out


def _atom_bytes(text: str) -> int:
    escaped = text.startswith(("\\u", "\\U")) and re.fullmatch(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))", text)
    if escaped:
        return len(chr(int(escaped.group(1) or escaped.group(2), 16)).encode("utf-8", "surrogatepass"))
    return 1 if text.startswith(("[", "\\", ".", "(")) else len(text.encode())


def expanded_size(node: Node) -> int:
    """Atoms with every bounded repetition written out (`x{2,5}` as five copies of x): the size of
    the position automaton the regex path determinizes, which predicts its cost better than the
    regex's length (a 9k-character regex of nested bounded repetitions can need gigabytes)."""
    if isinstance(node, Atom):
        return 1
    if isinstance(node, (Seq, Alt)):
        return sum(map(expanded_size, node.items if isinstance(node, Seq) else node.options))
    return max(node.lo if node.hi is None else node.hi, 1) * expanded_size(node.item)


def _alt(options: list[Node]) -> Node | None:
    return None if not options else options[0] if len(options) == 1 else Alt(tuple(options))


def _quantifier(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, 1):
        return "?"
    if hi is None:
        return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


class _Parser:
    def __init__(self, text: str):
        self.text = text

    def alternation(self, i: int) -> tuple[Node, int]:
        options = []
        while True:
            seq, i = self.sequence(i)
            options.append(seq)
            if i < len(self.text) and self.text[i] == "|":
                i += 1
                continue
            return (options[0] if len(options) == 1 else Alt(tuple(options))), i

    def sequence(self, i: int) -> tuple[Node, int]:
        items = []
        while i < len(self.text) and self.text[i] not in "|)":
            atom, i = self.atom(i)
            atom, i = self.quantified(atom, i)
            items.append(atom)
        return (items[0] if len(items) == 1 else Seq(tuple(items))), i

    def atom(self, i: int) -> tuple[Node, int]:
        t, c = self.text, self.text[i]
        if c == "(":
            if t.startswith("(?:", i) or not t.startswith("(?", i):
                node, j = self.alternation(i + (3 if t.startswith("(?:", i) else 1))
                if j >= len(t) or t[j] != ")":
                    raise GrammarError("internal: unclosed group in a generated regex")
                return node, j + 1
            j = self._group_end(i)  # a flag group such as (?i:...): opaque
            if RULE_OPEN in t[i:j]:
                raise GrammarError("internal: a rule inside a flag group")
            return Atom(t[i:j]), j
        if c == "[":
            j = _class_end(t, i)
            return Atom(t[i:j]), j
        if c == RULE_OPEN:
            j = t.index(RULE_CLOSE, i) + 1
            return Atom(t[i:j]), j
        if c == "\\":
            return Atom(t[i:(j := self._escape_end(i))]), j
        if c in "*+?{":
            raise GrammarError(f"internal: a quantifier without an operand at {i} in a generated regex")
        return Atom(c), i + 1

    def quantified(self, node: Node, i: int) -> tuple[Node, int]:
        t = self.text
        while i < len(t) and t[i] in "*+?{":
            if t[i] == "{":
                j = t.index("}", i)
                lo, _, hi = t[i + 1:j].partition(",")
                bounds = (int(lo or 0), int(lo) if "," not in t[i:j] else (int(hi) if hi else None))
                i = j + 1
            else:
                bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[t[i]]
                i += 1
            if i < len(t) and t[i] in "?+":
                raise GrammarError("internal: a lazy or possessive quantifier in a generated regex")
            node = Repeat(node, *bounds)
        return node, i

    def _escape_end(self, i: int) -> int:
        t = self.text
        c = t[i + 1]
        if c in "xuUpP" and i + 2 < len(t) and t[i + 2] == "{":
            return t.index("}", i) + 1
        return i + 2 + {"x": 2, "u": 4, "U": 8, "p": 1, "P": 1}.get(c, 0)

    def _group_end(self, i: int) -> int:
        depth, j, t = 0, i, self.text
        while j < len(t):
            c = t[j]
            if c == "\\":
                j = self._escape_end(j)
                continue
            if c == "[":
                j = _class_end(t, j)
                continue
            depth += (c == "(") - (c == ")")
            j += 1
            if depth == 0:
                return j
        raise GrammarError("internal: unclosed group in a generated regex")
