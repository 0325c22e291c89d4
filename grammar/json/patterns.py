"""ECMA-262 `pattern`s (and `format`s written as patterns) → regexes over JSON-encoded strings.

A pattern is parsed into a small AST (`parse_pattern`): ("set", intervals) | ("cat", [nodes]) |
("alt", [nodes]) | ("rep", node, lo, hi) | ("bol",) | ("eol",), hi None = unbounded. A
`StringSpec` is the whole-string language: top-level alternatives with their anchors resolved
(an unanchored side gets "any characters"), optionally intersected with a length range
(`with_length`: exact where one part varies in length, else a sound bound on every part), and
emitted with json.strings' encodings (`emit`).

Character classes take the intersection of the ECMA meaning and Python `re`'s meaning (what
`jsonschema` evaluates), so the result is sound under both: `\\d` is [0-9], `\\w` is
[A-Za-z0-9_], `\\s` the whitespace both agree on, `.` excludes line terminators, and negated forms
(`\\D`, `[^...]`) exclude what either engine's positive form would match. Unsupported constructs
(lookaround, backreferences, word boundaries, `\\p{..}`, ambiguous `{,n}`, anchors in mid-pattern,
flags) raise GrammarError.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.strings import (
    ALL,
    EMPTY,
    LINE_TERMINATORS,
    MAX_CP,
    Intervals,
    Limits,
    _shorthand,
    chars,
    complement,
    encode_charset,
    intersect,
    repeat,
    union,
)

# ---------------------------------------------------------------------------------------------
# Pattern AST: ("set", intervals) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", node, lo, hi)
#              | ("bol",) | ("eol",)          hi None = unbounded


class _Parser:
    def __init__(self, src: str):
        self.s = src
        self.i = 0

    def err(self, what: str) -> GrammarError:
        return GrammarError(f"{what} in pattern {self.s!r} (at offset {self.i})")

    def peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.s[j] if j < len(self.s) else None

    def parse(self):
        node = self.alt()
        if self.i != len(self.s):
            raise self.err("unbalanced ')'")
        return node

    def alt(self):
        branches = [self.seq()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.seq())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def seq(self):
        items = []
        while self.peek() is not None and self.peek() not in "|)":
            atom = self.atom()
            q = self.quantifier()
            if q is not None:
                if atom[0] in ("bol", "eol"):
                    raise self.err("quantified anchor")
                atom = ("rep", atom, q[0], q[1])
            items.append(atom)
        return items[0] if len(items) == 1 else ("cat", items)

    def _braces(self):
        """Parse {n}, {n,}, {n,m} at self.i; return (lo, hi, end) or None if not a quantifier."""
        j = self.i + 1
        s = self.s

        def num(j):
            k = j
            while k < len(s) and s[k].isdigit():
                k += 1
            return (int(s[j:k]) if k > j else None), k

        lo, j = num(j)
        if lo is None:
            return None
        if j < len(s) and s[j] == "}":
            return lo, lo, j + 1
        if j >= len(s) or s[j] != ",":
            return None
        hi, j = num(j + 1)
        if j < len(s) and s[j] == "}":
            return lo, hi, j + 1
        return None

    def quantifier(self):
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            q = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and self._braces() is not None:
            lo, hi, end = self._braces()
            if hi is not None and hi < lo:
                raise self.err("numbers out of order in {} quantifier")
            self.i = end
            q = (lo, hi)
        else:
            return None
        if self.peek() == "?":  # lazy: same language
            self.i += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self._braces() is not None):
            raise self.err("nothing to repeat")
        return q

    def atom(self):
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.s.startswith("?<", self.i) and self.peek(2) not in ("=", "!"):
                end = self.s.find(">", self.i)
                if end < 0:
                    raise self.err("bad group name")
                self.i = end + 1
            elif self.peek() == "?":
                raise self.err("unsupported group (lookaround or flags)")
            node = self.alt()
            if self.peek() != ")":
                raise self.err("missing ')'")
            self.i += 1
            return node
        if c == "[":
            return self.char_class()
        self.i += 1
        if c == ".":
            return ("set", complement(LINE_TERMINATORS))
        if c == "^":
            return ("bol",)
        if c == "$":
            return ("eol",)
        if c in ("*", "+", "?"):
            raise self.err("nothing to repeat")
        if c == "{":
            if self.peek() == ",":
                raise self.err("ambiguous '{,' (a quantifier in Python, a literal in ECMA)")
            self.i -= 1
            if self._braces() is not None:
                raise self.err("nothing to repeat")
            self.i += 1
            return ("set", chars("{"))
        if c == "\\":
            sub, _ = self.escape(in_class=False)
            return ("set", sub)
        return ("set", chars(c))

    def escape(self, in_class: bool) -> tuple[Intervals, Intervals]:
        """After a backslash: returns (sub, sup) sets."""
        c = self.peek()
        if c is None:
            raise self.err("trailing backslash")
        self.i += 1
        if c in "dDwWsS":
            return _shorthand(c)
        simple = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v"}
        if c in simple:
            x = chars(simple[c])
            return x, x
        if c == "b":
            if in_class:
                x = chars("\b")
                return x, x
            raise self.err("unsupported word boundary \\b")
        if c == "B":
            raise self.err("unsupported \\B")
        if c == "0" and not (self.peek() or "").isdigit():
            x = chars("\0")
            return x, x
        if c.isdigit():
            raise self.err("unsupported backreference")
        if c in "xu":
            n = 2 if c == "x" else 4
            if c == "u" and self.peek() == "{":
                end = self.s.find("}", self.i)
                h = self.s[self.i + 1:end] if end > 0 else ""
                if not h or any(ch not in "0123456789abcdefABCDEF" for ch in h) or int(h, 16) > MAX_CP:
                    raise self.err("bad \\u{...} escape")
                self.i = end + 1
            else:
                h = self.s[self.i:self.i + n]
                if len(h) != n or any(ch not in "0123456789abcdefABCDEF" for ch in h):
                    raise self.err(f"bad \\{c} escape")
                self.i += n
            cp = int(h, 16)
            if 0xD800 <= cp <= 0xDFFF:
                raise self.err("surrogate escape")
            return ((cp, cp),), ((cp, cp),)
        if c == "c":
            l = self.peek()
            if l is None or not l.isascii() or not l.isalpha():
                raise self.err("bad \\c escape")
            self.i += 1
            x = chars(chr(ord(l) % 32))
            return x, x
        if c.isascii() and c.isalnum():
            # ECMA (Annex B) and Python disagree on unknown letter escapes (\a, \k, \p, ...)
            raise self.err(f"unsupported escape \\{c}")
        x = chars(c)
        return x, x

    def char_class(self):
        self.i += 1  # [
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        if self.peek() == "]":
            raise self.err("ambiguous '[]' or '[^]' (ECMA and Python read it differently)")
        subs: list[Intervals] = []
        sups: list[Intervals] = []
        while True:
            c = self.peek()
            if c is None:
                raise self.err("unterminated character class")
            if c == "]":
                self.i += 1
                break
            if c == "[" and self.peek(1) in (":", "=", "."):
                raise self.err("unsupported POSIX class")
            lo_item = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", None):
                self.i += 1
                hi_item = self.class_atom()
                if lo_item[2] is None or hi_item[2] is None:
                    raise self.err("character class range with a shorthand")
                a, b = lo_item[2], hi_item[2]
                if a > b:
                    raise self.err("range out of order in character class")
                subs.append(((a, b),))
                sups.append(((a, b),))
            else:
                subs.append(lo_item[0])
                sups.append(lo_item[1])
        if negate:
            return ("set", complement(union(*sups)) if sups else ALL)
        return ("set", union(*subs) if subs else EMPTY)

    def class_atom(self) -> tuple[Intervals, Intervals, int | None]:
        c = self.peek()
        self.i += 1
        if c == "\\":
            sub, sup = self.escape(in_class=True)
            single = sub[0][0] if len(sub) == 1 and sub[0][0] == sub[0][1] and sub == sup else None
            return sub, sup, single
        x = chars(c)
        return x, x, ord(c)


@functools.lru_cache(maxsize=1024)
def parse_pattern(pattern: str):
    """Parse an ECMA-262 pattern into the AST (raises GrammarError on unsupported syntax)."""
    if not isinstance(pattern, str):
        raise GrammarError("pattern must be a string")
    return _Parser(pattern).parse()


def _branches(node) -> list[tuple[bool, bool, list]]:
    """Top-level alternatives as (anchored_start, anchored_end, items) with the anchors removed."""
    alts = node[1] if node[0] == "alt" else [node]
    out = []
    for b in alts:
        items = list(b[1]) if b[0] == "cat" else [b]
        start = end = False
        while items and items[0][0] == "bol":
            items.pop(0)
            start = True
        while items and items[-1][0] == "eol":
            items.pop()
            end = True
        if len(items) == 1 and items[0][0] == "alt" and _has_anchor(items[0]):
            # ^(?:a$|b$) style: distribute the outer anchors over an inner alternation
            for s2, e2, inner in _branches(items[0]):
                out.append((start or s2, end or e2, inner))
            continue
        if any(_has_anchor(x) for x in items):
            raise GrammarError("unsupported anchor in the middle of a pattern")
        out.append((start, end, items))
    return out


def _has_anchor(node) -> bool:
    kind = node[0]
    if kind in ("bol", "eol"):
        return True
    if kind in ("cat", "alt"):
        return any(_has_anchor(x) for x in node[1])
    if kind == "rep":
        return _has_anchor(node[1])
    return False


def length_range(node) -> tuple[int, int | None]:
    kind = node[0]
    if kind == "set":
        return (1, 1) if node[1] else (0, 0)
    if kind in ("bol", "eol"):
        return 0, 0
    if kind == "cat":
        lo, hi = 0, 0
        for x in node[1]:
            a, b = length_range(x)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if kind == "alt":
        rs = [length_range(x) for x in node[1]]
        return min(r[0] for r in rs), (None if any(r[1] is None for r in rs) else max(r[1] for r in rs))
    a, b = length_range(node[1])
    hi = None if node[3] is None or b is None else b * node[3]
    if node[3] == 0:
        hi = 0
    return a * node[2], hi


@dataclass
class StringSpec:
    """Alternatives, each a list of AST items matching the whole decoded string."""

    branches: list[list]

    @staticmethod
    def any(min_len: int = 0, max_len: int | None = None) -> "StringSpec":
        return StringSpec([[("rep", ("set", ALL), min_len, max_len)]])

    @staticmethod
    def from_pattern(pattern: str) -> "StringSpec":
        out = []
        for start, end, items in _branches(parse_pattern(pattern)):
            items = ([] if start else [("rep", ("set", ALL), 0, None)]) + items + \
                ([] if end else [("rep", ("set", ALL), 0, None)])
            out.append(_first_occurrence(items))
        return StringSpec(out)

    def with_length(self, lo: int, hi: int | None) -> "tuple[StringSpec, bool] | None":
        """Intersect with a length range. Returns (spec, narrowed) or None if this shape can't be
        constrained soundly. narrowed=True: exact was impossible, so repetitions were bounded to keep
        every string within `hi` (a subset of the intersection)."""
        out = []
        narrowed = False
        for items in self.branches:
            node = ("cat", items)
            try:
                r = _restrict(node, lo, hi)
            except _CantRestrict:
                if lo > length_range(node)[0] or hi is None:
                    return None
                r = _cap_total(node, hi)
                narrowed = True
            if r is not None:
                out.append(r[1] if r[0] == "cat" else [r])
        return StringSpec(out), narrowed

    def emit(self, limits: Limits, narrowed: list[str], where: str) -> str | None:
        alts = []
        for items in self.branches:
            parts = [_emit(x, limits, narrowed, where) for x in items]
            if any(p is None for p in parts):
                continue
            alts.append("".join(parts))
        if not alts:
            return None
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return '"' + body + '"'


def _first_occurrence(items: list) -> list:
    """`.*S.*` (an unanchored one-character pattern, `S+` too) as `[^S]*S.*`: the same strings,
    but unambiguous, so a backtracking engine doesn't go quadratic on it."""
    if len(items) != 3 or items[0] != ("rep", ("set", ALL), 0, None) or items[2] != items[0]:
        return items
    mid = items[1]
    if mid[0] == "rep" and mid[1][0] == "set" and mid[2] == 1 and mid[3] is None:
        mid = mid[1]
    if mid[0] != "set":
        return items
    return [("rep", ("set", complement(mid[1])), 0, None), mid, items[2]]


class _CantRestrict(Exception):
    pass


def _restrict(node, lo: int, hi: int | None):
    """node ∩ (strings of length lo..hi), exactly, as an AST; None if empty. Raises _CantRestrict
    where that would need counting across several variable-length parts."""
    a, b = length_range(node)
    if hi is not None and a > hi or (b is not None and b < lo):
        return None
    if a >= lo and (hi is None or (b is not None and b <= hi)):
        return node
    kind = node[0]
    if kind == "alt":
        parts = [r for r in (_restrict(x, lo, hi) for x in node[1]) if r is not None]
        return None if not parts else parts[0] if len(parts) == 1 else ("alt", parts)
    if kind == "cat":
        items = node[1]
        var = [i for i, x in enumerate(items) if length_range(x)[0] != length_range(x)[1]]
        if len(var) != 1:
            raise _CantRestrict
        k = var[0]
        fixed = a - length_range(items[k])[0]
        sub = _restrict(items[k], max(0, lo - fixed), None if hi is None else hi - fixed)
        if sub is None:
            return None
        return ("cat", items[:k] + [sub] + items[k + 1:])
    if kind == "rep":
        _, inner, m, n = node
        w_lo, w_hi = length_range(inner)
        if w_lo == w_hi:
            if w_lo == 0:
                return node
            c_lo = max(m, -(-lo // w_lo))
            c_hi = (n if hi is None else (hi // w_lo if n is None else min(n, hi // w_lo)))
            return None if c_hi is not None and c_hi < c_lo else ("rep", inner, c_lo, c_hi)
        if (m, n) == (0, 1):
            parts = [("cat", [])] if lo == 0 else []
            r = _restrict(inner, lo, hi)
            if r is not None:
                parts.append(r)
            return None if not parts else parts[0] if len(parts) == 1 else ("alt", parts)
    raise _CantRestrict


def _cap_total(node, budget: int):
    """Bound the variable repetitions of node uniformly so that no string is longer than budget."""
    def cap(x, t):
        kind = x[0]
        if kind in ("cat", "alt"):
            return (kind, [cap(y, t) for y in x[1]])
        if kind == "rep":
            _, inner, m, n = x
            inner = cap(inner, t)
            n2 = m + t if n is None else min(n, m + t)
            return ("rep", inner, m, n2)
        return x

    best = None
    lo_t, hi_t = 0, budget
    while lo_t <= hi_t:
        t = (lo_t + hi_t) // 2
        c = cap(node, t)
        if length_range(c)[1] <= budget:
            best, lo_t = c, t + 1
        else:
            hi_t = t - 1
    if best is None:
        raise GrammarError("pattern cannot be kept within the maximum length")
    return best


def _emit(node, limits: Limits, narrowed: list[str], where: str, pairs: bool = True) -> str | None:
    kind = node[0]
    if kind == "set":
        return encode_charset(node[1], pairs)
    if kind == "cat":
        parts = [_emit(x, limits, narrowed, where, pairs) for x in node[1]]
        if any(p is None for p in parts):
            return None
        return "".join(parts)
    if kind == "alt":
        parts = [p for p in (_emit(x, limits, narrowed, where, pairs) for x in node[1]) if p is not None]
        if not parts:
            return None
        parts = list(dict.fromkeys(parts))
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    if kind == "rep":
        _, inner, lo, hi = node
        if hi == 0:
            return ""
        x = _emit(inner, limits, narrowed, where, pairs=hi is None and pairs)
        if x is None:
            return "" if lo == 0 else None
        if x == "":
            return ""
        return repeat(x, lo, hi, limits, narrowed, where)
    raise AssertionError(kind)


def matches_everything(spec: StringSpec) -> bool:
    """True if some branch matches every string: all its items may be empty and one is `.*` over
    all characters (what an unanchored side gets)."""
    for items in spec.branches:
        if all(length_range(x)[0] == 0 for x in items) and \
                any(x[0] == "rep" and x[1] == ("set", ALL) and x[3] is None for x in items):
            return True
    return False


def _first(items: list) -> tuple[Intervals, bool]:
    """(the characters a match of the item sequence can start with, whether it can be empty)."""
    acc: Intervals = EMPTY
    for x in items:
        kind = x[0]
        if kind == "set":
            return union(acc, x[1]), False
        if kind == "cat":
            f, nullable = _first(list(x[1]))
        elif kind == "alt":
            firsts = [_first([b]) for b in x[1]]
            f, nullable = union(*(a for a, _ in firsts)), any(n for _, n in firsts)
        elif kind == "rep":
            f, nullable = _first([x[1]])
            nullable = nullable or x[2] == 0
        else:  # anchors match the empty string
            f, nullable = EMPTY, True
        acc = union(acc, f)
        if not nullable:
            return acc, False
    return acc, True


def first_chars(spec: StringSpec) -> tuple[Intervals, bool]:
    """(the possible first characters of a matching string, whether "" matches)."""
    firsts = [_first(items) for items in spec.branches]
    return union(EMPTY, *(f for f, _ in firsts)), any(n for _, n in firsts)


def _fixed_prefix(items: list) -> list[Intervals]:
    """The character sets of the first characters, as far as each position has one set."""
    out = []
    for x in items:
        if x[0] == "set":
            out.append(x[1])
            continue
        if x[0] == "rep" and x[1][0] == "set" and x[2] >= 1:
            out += [x[1][1]] * x[2]
            if x[2] == x[3]:
                continue
        break
    return out


def _prefixes_differ(a: list, b: list) -> bool:
    return any(not intersect(x, y) for x, y in zip(_fixed_prefix(a), _fixed_prefix(b)))


def provably_disjoint(a: StringSpec, b: StringSpec) -> bool:
    """No string matches both: neither matches "" and their first characters differ, or each
    pair of branches has a position in its fixed-length prefixes where the characters differ."""
    fa, na = first_chars(a)
    fb, nb = first_chars(b)
    if not na and not nb and not intersect(fa, fb):
        return True
    return all(_prefixes_differ(x, y) for x in a.branches for y in b.branches)
