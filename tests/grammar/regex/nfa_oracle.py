"""The Python construction of a regex's byte NFA (Thompson's, big subtrees built once and copied):
the oracle the native construction (grammar/csrc/nfa_build.c) is held to."""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gdserve.grammar.regex import tree as rt
from gdserve.grammar.regex.nfa import MAX_NFA_NODES, ByteNFA, TooManyNodes, Unsupported
from gdserve.grammar.regex.syntax import _class_end

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
_SIMPLE_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07}
FRAGMENT_SIZE = 24  # subtrees of this many atoms (regex.tree's size) or more are built once and copied


def oracle_nfa(pattern: str) -> ByteNFA:
    """build_nfa's NFA, built in Python."""
    builder = _Builder()
    end = builder.add(parse_indexed(pattern), builder.new())
    eps, edges = builder.arrays()
    return assemble_nfa(builder.num_nodes, eps, edges, 0, end)


@dataclass(frozen=True)
class _Fragment:
    """A subtree's nodes built once, numbered from its entry (0), copied wherever it recurs (a
    bounded repetition's copies, the string and number patterns of every property)."""
    num_nodes: int
    exit: int
    eps: np.ndarray    # int32 [E, 2]: source, target
    edges: np.ndarray  # int32 [B, 4]: source, first byte, last byte, target


class _Builder:
    """Nodes are numbers; edges go to flat lists (one list per node would be a container per
    node for the garbage collector to trace, which dominates on big regexes), and the copies
    of big subtrees to arrays (_Fragment)."""

    def __init__(self, fragments: dict[int, _Fragment] | None = None, root: rt.Node | None = None):
        self.root = root  # the subtree a fragment builder builds (itself not a fragment)
        self.num_nodes = 0
        self.eps_src: list[int] = []
        self.eps_dst: list[int] = []
        self.edges: list[int] = []  # source, first byte, last byte, target; flat
        self.copies: list[tuple[np.ndarray, np.ndarray]] = []  # fragments' eps and edges, renumbered
        self.fragments = {} if fragments is None else fragments  # by id of the tree node

    def new(self) -> int:
        if self.num_nodes >= MAX_NFA_NODES:
            raise TooManyNodes(f"more than {MAX_NFA_NODES:,} NFA nodes")
        self.num_nodes += 1
        return self.num_nodes - 1

    def eps(self, src: int, dst: int) -> None:
        self.eps_src.append(src)
        self.eps_dst.append(dst)

    def add(self, node: rt.Node, start: int) -> int:
        """Append node's fragment entered at `start` (which no fragment loops back to); returns
        its end node."""
        if isinstance(node, rt.Atom):
            return self._atom(node.text, start)
        if node.size >= FRAGMENT_SIZE and node is not self.root:
            return self._copy(self._fragment(node), start)
        if isinstance(node, rt.Seq):
            for item in node.items:
                start = self.add(item, start)
            return start
        if isinstance(node, rt.Alt):
            end = self.new()
            for option in node.options:
                self.eps(self.add(option, start), end)
            return end
        return self._repeat(node, start)

    def _repeat(self, node: rt.Repeat, start: int) -> int:
        lo, hi = node.lo, node.hi
        if hi is not None and hi < lo:
            raise Unsupported("a repetition whose bounds are reversed")
        for _ in range(lo if hi is not None or lo == 0 else lo - 1):
            start = self.add(node.item, start)
        if hi is None:  # a loop on a fresh entry, so nothing else shares its back edge
            head = self.new()
            self.eps(start, head)
            tail = self.add(node.item, head)
            self.eps(tail, head)
            if lo == 0:
                return head
            end = self.new()
            self.eps(tail, end)
            return end
        end = self.new()
        for _ in range(hi - lo):
            self.eps(start, end)
            start = self.add(node.item, start)
        self.eps(start, end)
        return end

    def _fragment(self, node: rt.Node) -> _Fragment:
        out = self.fragments.get(id(node))
        if out is None:
            sub = _Builder(self.fragments, node)
            exit_ = sub.add(node, sub.new())
            eps, edges = sub.arrays()
            out = self.fragments[id(node)] = _Fragment(sub.num_nodes, exit_, eps, edges)
        return out

    def _copy(self, fragment: _Fragment, start: int) -> int:
        """Renumber the fragment's nodes: its entry is `start`, the rest new."""
        base = self.num_nodes - 1
        if self.num_nodes + fragment.num_nodes > MAX_NFA_NODES:
            raise TooManyNodes(f"more than {MAX_NFA_NODES:,} NFA nodes")
        self.num_nodes += fragment.num_nodes - 1
        eps = fragment.eps + base
        eps[fragment.eps == 0] = start
        edges = fragment.edges.copy()
        for col in (0, 3):
            edges[:, col] += base
            edges[fragment.edges[:, col] == 0, col] = start
        self.copies.append((eps, edges))
        return start if fragment.exit == 0 else fragment.exit + base

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(int32 [E, 2] epsilon edges, int32 [B, 4] byte edges) of everything built."""
        eps = np.array([self.eps_src, self.eps_dst], dtype=np.int32).T.reshape(-1, 2)
        edges = np.array(self.edges, dtype=np.int32).reshape(-1, 4)
        return (np.concatenate([eps, *(c[0] for c in self.copies)]),
                np.concatenate([edges, *(c[1] for c in self.copies)]))

    def _atom(self, text: str, start: int) -> int:
        """The atom's UTF-8 sequences with their common suffixes shared (as regex-automata's
        UTF-8 compiler does): the bytes left of a character lead to one node whatever its
        first bytes were, so the DFA needs no state per first byte."""
        end = self.new()
        edges, suffix = self.edges, {}
        for seq in atom_sequences(text):
            at = end
            for lo, hi in reversed(seq[1:]):
                node = suffix.get((lo, hi, at))
                if node is None:
                    node = suffix[lo, hi, at] = self.new()
                    edges += (node, lo, hi, at)
                at = node
            edges += (start, *seq[0], at)
        return end


def assemble_nfa(num_nodes: int, eps: np.ndarray, edges: np.ndarray, start: int, accept: int) -> ByteNFA:
    """The ByteNFA of int32 [E, 2] epsilon edges (source, target) and [B, 4] byte edges (source,
    first byte, last byte, target): byte classes and CSR form."""
    starts = np.zeros(257, dtype=bool)  # where a byte class starts: 0, each range's first byte and the byte past it
    starts[[0, 256]] = True
    starts[edges[:, 1]] = True
    starts[edges[:, 2] + 1] = True
    class_of = (np.cumsum(starts[:256]) - 1).astype(np.uint8)
    eps_ptr, eps_to = _csr(eps[:, 0], eps[:, 1], num_nodes)
    edge_ptr, order = _csr(edges[:, 0], np.arange(len(edges), dtype=np.int32), num_nodes)
    edges = edges[order]
    return ByteNFA(start, accept, eps_ptr, eps_to, edge_ptr, class_of[edges[:, 1]].astype(np.int32),
                   class_of[edges[:, 2]].astype(np.int32), np.ascontiguousarray(edges[:, 3]), class_of)


def _csr(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [n + 1] offsets, int32 targets grouped by source) of the edges src -> dst."""
    ptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    return ptr, np.ascontiguousarray(dst[np.argsort(src, kind="stable")], dtype=np.int32)


def parse_indexed(pattern: str) -> rt.Node:
    """The tree of a pattern that ends in `\\z` (a full match), without the `\\z`."""
    try:
        node = rt.parse(pattern)
    except (rt.GrammarError, ValueError, IndexError) as e:
        raise Unsupported(str(e)) from None
    items = node.items if isinstance(node, rt.Seq) else (node,)
    if not items or not isinstance(items[-1], rt.Atom) or items[-1].text != "\\z":
        raise Unsupported("a pattern not anchored at its end")
    return rt.Seq(items[:-1])


@lru_cache(maxsize=4096)
def atom_sequences(text: str) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The byte-range sequences of an atom's UTF-8 encodings (see utf8_sequences)."""
    return tuple(map(tuple, utf8_sequences(atom_ranges(text))))


def atom_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """The code points an atom matches, as sorted disjoint (first, last) ranges."""
    if text == ".":
        return _complement([(0x0A, 0x0A)])
    if text.startswith("["):
        return _class_ranges(text)
    if text.startswith("\\"):
        cp, j = _escape(text, 0)
        if j != len(text):
            raise Unsupported(f"escape {text!r}")
        return ((cp, cp),)
    if len(text) != 1 or text in "^$" or SURROGATES[0] <= ord(text) <= SURROGATES[1]:
        raise Unsupported(f"atom {text!r}")
    return ((ord(text), ord(text)),)


def _escape(text: str, i: int) -> tuple[int, int]:
    """(the code point of the escape at text[i], the index past it)."""
    c = text[i + 1] if i + 1 < len(text) else ""
    if c in ("x", "u", "U"):
        if text.startswith("{", i + 2):
            j = text.index("}", i)
            digits, end = text[i + 3:j], j + 1
        else:
            n = {"x": 2, "u": 4, "U": 8}[c]
            digits, end = text[i + 2:i + 2 + n], i + 2 + n
        if not digits or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise Unsupported(f"escape {text[i:end]!r}")
        cp = int(digits, 16)
        if cp > MAX_CODEPOINT or SURROGATES[0] <= cp <= SURROGATES[1]:
            raise Unsupported(f"escape {text[i:end]!r}")
        return cp, end
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 2
    if c and c.isascii() and not c.isalnum() and not c.isspace():
        return ord(c), i + 2
    raise Unsupported(f"escape \\{c}")


def _class_ranges(text: str) -> tuple[tuple[int, int], ...]:
    if _class_end(text, 0) != len(text):
        raise Unsupported(f"class {text!r}")
    body = text[1:-1]
    negate = body.startswith("^")
    body = body[negate:]
    if any(op in body for op in ("&&", "--", "~~")):
        raise Unsupported(f"class set operations in {text!r}")
    items, i = [], 0
    while i < len(body):
        cp, i = _class_char(body, i, first=i == 0)
        if body.startswith("-", i) and i + 1 < len(body):
            hi, i = _class_char(body, i + 1, first=False)
            if hi < cp:
                raise Unsupported(f"reversed range in {text!r}")
            items.append((cp, hi))
        else:
            items.append((cp, cp))
    ranges = _normalize(items)
    return _complement(ranges) if negate else ranges


def _class_char(body: str, i: int, first: bool) -> tuple[int, int]:
    c = body[i]
    if c == "\\":
        return _escape(body, i)
    if c == "[" or (c == "]" and not first):
        raise Unsupported("a nested class")
    if SURROGATES[0] <= ord(c) <= SURROGATES[1]:
        raise Unsupported("a surrogate")
    return ord(c), i + 1


def _normalize(items: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(items):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _complement(ranges) -> tuple[tuple[int, int], ...]:
    """Every Unicode scalar value not in `ranges` (sorted, disjoint)."""
    out, nxt = [], 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return tuple(out)


def utf8_sequences(ranges) -> list[list[tuple[int, int]]]:
    """The UTF-8 encodings of the scalar values in `ranges` as sequences of byte ranges (every
    byte string a sequence matches, bytes in order, encodes one of them, and each is matched
    by exactly one sequence; surrogates excluded)."""
    out, stack = [], list(ranges)[::-1]
    while stack:
        lo, hi = stack.pop()
        if lo > hi:
            continue
        if lo <= SURROGATES[1] and hi >= SURROGATES[0]:
            stack += [(SURROGATES[1] + 1, hi), (lo, SURROGATES[0] - 1)]
            continue
        split = next((b for b in (0x7F, 0x7FF, 0xFFFF) if lo <= b < hi), None)
        if split is not None:
            stack += [(split + 1, hi), (lo, split)]
            continue
        if hi <= 0x7F:
            out.append([(lo, hi)])
            continue
        for i in (1, 2, 3):
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    stack += [((lo | m) + 1, hi), (lo, lo | m)]
                    break
                if hi & m != m:
                    stack += [(hi & ~m, hi), (lo, (hi & ~m) - 1)]
                    break
        else:
            a, b = chr(lo).encode(), chr(hi).encode()
            out.append(list(zip(a, b)))
    return out
