"""Regexes as trees, for the regexes json.schema writes (outlines-core's dialect) with rule
placeholders in them: parse, print back, and the two operations json.schema_cfg needs to cut a
regex into grammar terminals: `nullable` (matches the empty string) and `nonempty` (the same
language without the empty string).

A placeholder `RULE_OPEN name RULE_CLOSE` (two private-use characters, which the generated
regexes never contain raw: they write non-ASCII as escapes) is an atom standing for a rule;
`SUB_OPEN ... SUB_CLOSE` one for a sub-automaton its writer builds directly (json.keys), with
its size and byte sizes written in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gdserve.grammar.bounded_cache import BoundedCache
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.regex.syntax import _class_end

RULE_OPEN, RULE_CLOSE = "\ue000", "\ue001"
SUB_OPEN, SUB_CLOSE = "\ue002", "\ue003"


def placeholder(name: str) -> str:
    return f"{RULE_OPEN}{name}{RULE_CLOSE}"


def sub_placeholder(payload: str, size: int, sizes: tuple[int, int]) -> str:
    """An atom for a sub-automaton (payload: [0-9a-f] only, which no regex syntax reads); size
    and sizes as _Derived's."""
    return f"{SUB_OPEN}{size}.{sizes[0]}.{sizes[1]}.{payload}{SUB_CLOSE}"


def sub_payload(atom: str) -> str:
    return atom[1:-1].split(".", 3)[3]


@dataclass(frozen=True)
class _Derived:
    """What callers ask of every node on the way down, computed once when a node is made
    (children first): `rules` (it holds a rule placeholder), `size` (atoms with every bounded
    repetition written out: the size of the position automaton the regex path determinizes,
    which predicts its cost better than the regex's length: a 9k-character regex of nested
    bounded repetitions can need gigabytes), `sizes` ((fewest UTF-8 bytes, longest shortest text
    of an optional part), see ByteSizes; None where a rule is held), `long` (it holds a long
    repetition: LONG_REPEAT_COPIES optional copies or more, LONG_REPEAT_SIZE atoms or more, such
    as a string's maxLength: the grammar path gives those a terminal of their own)."""
    rules: bool = field(init=False, compare=False, repr=False)
    size: int = field(init=False, compare=False, repr=False)
    sizes: tuple[int, int] | None = field(init=False, compare=False, repr=False)
    long: bool = field(init=False, compare=False, repr=False)

    def _derive(self, rules: bool, size: int, sizes: tuple[int, int] | None, long: bool = False) -> None:
        object.__setattr__(self, "rules", rules)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "sizes", None if rules else sizes)
        object.__setattr__(self, "long", long)


@dataclass(frozen=True)
class Atom(_Derived):
    text: str   # a character, an escape, a class, `.`, or an opaque flag group

    def __post_init__(self):
        if self.text.startswith(SUB_OPEN):
            size, fewest, optional, _ = self.text[1:-1].split(".", 3)
            self._derive(False, int(size), (int(fewest), int(optional)))
            return
        rule = self.text.startswith(RULE_OPEN)
        self._derive(rule, 1, None if rule else (_atom_bytes(self.text), 0))

    @property
    def rule(self) -> str | None:
        return self.text[1:-1] if self.rules else None


@dataclass(frozen=True)
class Seq(_Derived):
    items: tuple

    def __post_init__(self):
        rules = any([x.rules for x in self.items])
        self._derive(rules, sum([x.size for x in self.items]), None if rules else
                     (sum([x.sizes[0] for x in self.items]), max([x.sizes[1] for x in self.items], default=0)),
                     any([x.long for x in self.items]))


@dataclass(frozen=True)
class Alt(_Derived):
    options: tuple

    def __post_init__(self):
        rules = any([x.rules for x in self.options])
        self._derive(rules, sum([x.size for x in self.options]), None if rules else
                     (min([x.sizes[0] for x in self.options]), max([max(x.sizes) for x in self.options])),
                     any([x.long for x in self.options]))


@dataclass(frozen=True)
class Repeat(_Derived):
    item: object
    lo: int
    hi: int | None  # None: unbounded

    def __post_init__(self):
        item = self.item
        size = max(self.lo if self.hi is None else self.hi, 1) * item.size
        self._derive(item.rules, size, None if item.rules else (self.lo * item.sizes[0], max(item.sizes)),
                     item.long or _long(self.lo, self.hi, size))


Node = Atom | Seq | Alt | Repeat
EMPTY = Seq(())
LONG_REPEAT_COPIES = 8
LONG_REPEAT_SIZE = 256


def is_long_repeat(node: Node) -> bool:
    """A bounded repetition of LONG_REPEAT_COPIES optional copies and LONG_REPEAT_SIZE atoms or
    more (`[ \\t]{0,24}` is not; a string of up to 20 characters is)."""
    return isinstance(node, Repeat) and _long(node.lo, node.hi, node.size)


def _long(lo: int, hi: int | None, size: int) -> bool:
    return hi is not None and hi - lo >= LONG_REPEAT_COPIES and size >= LONG_REPEAT_SIZE


def parse(text: str) -> Node:
    """The tree of a generated regex. A group whose text was parsed before (the JSON string and
    number regexes recur in every member) is that tree again, one object: callers that memoize by
    node id size it once."""
    node = _GROUPS.get(text)
    if node is None:
        node, i = _Parser(text).alternation(0)
        if i != len(text):
            raise GrammarError(f"internal: unbalanced ')' at {i} in a generated regex")
        _remember(text, node)
    return node


_GROUPS_MAX = 100_000
_GROUPS: BoundedCache[str, Node] = BoundedCache(_GROUPS_MAX)  # group or regex text -> its tree (short texts only)
_GROUP_TEXT_MAX = 4096
_SYNTAX = re.compile(r"\\.|[\[\]()|]", re.S)


def _remember(text: str, node: Node) -> None:
    if len(text) <= _GROUP_TEXT_MAX:
        _GROUPS.put(text, node)


def _group_ends(text: str) -> dict[int, int]:
    """Each group's `(` index -> its `)` index (see _structure)."""
    return _structure(text)[0]


def alternates_at_top(text: str) -> bool:
    """Whether the regex has a `|` outside every group (then no text is common to all matches)."""
    return _structure(text)[1]


def _structure(text: str) -> tuple[dict[int, int], bool]:
    """(each group's `(` index -> its `)` index, a `|` at depth 0), outside character classes
    (nested as in Rust, a leading `]` literal: regex.syntax._class_end's reading) and escapes."""
    ends, opens, depth, literal_at, top_bar = {}, [], 0, -1, False
    for m in _SYNTAX.finditer(text):
        c, i = m.group(), m.start()
        if depth:
            if c == "[":
                depth += 1
            elif c == "]" and i != literal_at:
                depth -= 1
        elif c == "(":
            opens.append(i)
        elif c == ")":
            if opens:
                ends[opens.pop()] = i
        elif c == "[":
            depth = 1
            literal_at = i + 1 + text.startswith("^", i + 1)
        elif c == "|" and not opens:
            top_bar = True
    return ends, top_bar


def to_regex(node: Node, memo: dict[int, str] | None = None) -> str:
    """The regex text of node; memo: id(node) -> text, for a caller that asks of every node on
    the way down (it keeps the nodes alive)."""
    out = None if memo is None else memo.get(id(node))
    if out is not None:
        return out
    if isinstance(node, Atom):
        return node.text
    if isinstance(node, Seq):
        out = "".join(f"(?:{to_regex(x, memo)})" if isinstance(x, Alt) else to_regex(x, memo) for x in node.items)
    elif isinstance(node, Alt):
        out = "|".join(to_regex(o, memo) for o in node.options)
    else:
        inner = to_regex(node.item, memo)
        if not isinstance(node.item, Atom):
            inner = f"(?:{inner})"
        out = inner + _quantifier(node.lo, node.hi)
    if memo is not None:
        memo[id(node)] = out
    return out


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
    """Fewest UTF-8 bytes of nodes (a class or `.` counts 1; a rule counts its rule's fewest,
    found as a fixpoint from "unbounded" down over `rules`, name -> tree) and the longest shortest
    text of an optional or repeated part of a node (an alternative, a repetition's item: what one
    token may commit to once it takes that part).

    Each node is reduced once to a form: its rule-free parts sized, what holds a rule kept as a
    skeleton (a rule's name, or [kind, sizes of the rule-free parts, the rest]); the fixpoint's
    passes evaluate only skeletons. The trees must outlive this object (nodes are keyed by id)."""

    def __init__(self, rules: dict[str, Node] | None = None):
        rules = rules or {}
        self.rules: dict[str, int] = dict.fromkeys(rules, 1 << 30)
        self._forms: dict[int, object] = {}  # id(node) -> form
        forms = {name: self._form(tree) for name, tree in rules.items()}
        changed = True
        order = _dependencies_first({name: _form_refs(form) for name, form in forms.items()})
        while changed:
            changed = False
            for name in order:
                n = self._eval(forms[name])[0]
                if n < self.rules[name]:
                    self.rules[name], changed = n, True

    def min_bytes(self, node: Node) -> int:
        return self._eval(self._form(node))[0]

    def max_optional_bytes(self, node: Node) -> int:
        return self._eval(self._form(node))[1]

    def _form(self, node: Node) -> object:
        """node.sizes for a rule-free node; a rule's name; or [_SEQ | _ALT, the rule-free items'
        or options' sizes combined, [forms of the others]] | [_REPEAT, lo, the item's form]."""
        if node.sizes is not None:
            return node.sizes
        form = self._forms.get(id(node))
        if form is not None:
            return form
        if isinstance(node, Atom):
            form = node.rule
        elif isinstance(node, Repeat):
            form = [_REPEAT, node.lo, self._form(node.item)]
        else:
            parts = [self._form(x) for x in (node.items if isinstance(node, Seq) else node.options)]
            fixed = [p for p in parts if type(p) is tuple]
            rest = [p for p in parts if type(p) is not tuple]
            if isinstance(node, Seq):
                form = [_SEQ, (sum(m for m, _ in fixed), max((o for _, o in fixed), default=0)), rest]
            else:
                form = [_ALT, (min((m for m, _ in fixed), default=1 << 62),
                               max((max(p) for p in fixed), default=0)), rest]
        self._forms[id(node)] = form
        return form

    def _eval(self, form: object) -> tuple[int, int]:
        if type(form) is tuple:
            return form
        if type(form) is str:
            return self.rules[form], 0
        kind, a, b = form
        if kind == _REPEAT:
            m, o = self._eval(b)
            return a * m, max(m, o)
        m, o = a
        for part in b:
            pm, po = self._eval(part)
            if kind == _SEQ:
                m, o = m + pm, max(o, po)
            else:
                m, o = min(m, pm), max(o, pm, po)
        return m, o


_SEQ, _ALT, _REPEAT = 0, 1, 2


def _dependencies_first(refs: dict[str, list[str]]) -> list[str]:
    """The rules' names, each after the rules it refers to (refs) where no cycle runs through
    them (depth-first post-order), so that one pass of a fixpoint over them settles all but cycles."""
    order, seen = [], set()
    for root in refs:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(refs[root]))]
        while stack:
            name, it = stack[-1]
            nxt = next((r for r in it if r not in seen and r in refs), None)
            if nxt is None:
                order.append(name)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(refs[nxt])))
    return order


def _form_refs(form: object) -> list[str]:
    """The rules a ByteSizes form refers to."""
    out, stack = [], [form]
    while stack:
        form = stack.pop()
        if type(form) is str:
            out.append(form)
        elif type(form) is list:
            stack.extend(form[2] if form[0] != _REPEAT else [form[2]])
    return out


def _atom_bytes(text: str) -> int:
    escaped = text.startswith(("\\u", "\\U")) and re.fullmatch(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))", text)
    if escaped:
        return len(chr(int(escaped.group(1) or escaped.group(2), 16)).encode("utf-8", "surrogatepass"))
    return 1 if text.startswith(("[", "\\", ".", "(")) else len(text.encode())


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
        self.ends = _group_ends(text) if "(" in text else {}

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
                inner = i + (3 if t.startswith("(?:", i) else 1)
                end = self.ends.get(i)
                node = None if end is None else _GROUPS.get(t[inner:end])
                if node is not None:
                    return node, end + 1
                node, j = self.alternation(inner)
                if j >= len(t) or t[j] != ")":
                    raise GrammarError("internal: unclosed group in a generated regex")
                if j == end:
                    _remember(t[inner:end], node)
                return node, j + 1
            j = self._group_end(i)  # a flag group such as (?i:...): opaque
            if RULE_OPEN in t[i:j]:
                raise GrammarError("internal: a rule inside a flag group")
            return Atom(t[i:j]), j
        if c == "[":
            j = _class_end(t, i)
            return Atom(t[i:j]), j
        if c == RULE_OPEN or c == SUB_OPEN:
            j = t.index(RULE_CLOSE if c == RULE_OPEN else SUB_CLOSE, i) + 1
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
