"""A regex as a byte-level NFA (Thompson's construction over regex.tree's parse, in C:
grammar/csrc/nfa_build.c), in flat arrays that grammar/csrc/byte_dfa.c determinizes in time
proportional to the DFA's transitions. The parse goes to C as a prefix program (tree_program),
bounded repetitions unexpanded.

outlines-core determinizes a JSON schema's regex at tens of microseconds a state (and its tables
are converted after); this construction is linear in the regex once its bounded repetitions are
written out, and each of its DFA states costs microseconds in C. It reads the dialect that
json.schema and choice lists write and the common part of user regexes: literal characters,
escapes (`\\n`, `\\xNN`, `\\x{N}`, `\\uNNNN`, `\\u{N}`, `\\UNNNNNNNN`, escaped punctuation), `.`,
flat character classes (ranges, negation), groups, alternation and repetition, and a pattern
ending in `\\z` (token_index.indexed_pattern's form: a full match, the plain language). Anything
else (Unicode classes such as `\\d`, flags, nested classes, class set operations) raises
Unsupported, and the caller keeps outlines-core's DFA: the same language either way.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gdserve.grammar import native
from gdserve.grammar.regex import tree as rt
from gdserve.grammar.regex.syntax import _class_end

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_NFA_NODES = 4_000_000  # beyond this the regex is left to outlines-core (and its limits)
_SIMPLE_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07}


_INDEXED = re.compile(r"(\\x\{[0-9A-F]+\})\(\?:(.*)\)\\z", re.S)  # token_index.indexed_pattern's form


class Unsupported(Exception):
    """Syntax this construction does not read (the caller falls back to outlines-core)."""


class TooManyNodes(Unsupported):
    """A pattern past MAX_NFA_NODES: its automaton would be larger still, so the caller refuses it
    (outlines-core's construction aborts the process where memory runs out)."""


@dataclass(frozen=True)
class ByteNFA:
    """Nodes 0..n-1; `start` and `accept` nodes; epsilon edges and byte-class-range edges in CSR
    form; bytes in `class_of` intervals (a range of bytes is a range of classes)."""
    start: int
    accept: int
    eps_ptr: np.ndarray   # int32 [n + 1]
    eps_to: np.ndarray    # int32 [E]
    edge_ptr: np.ndarray  # int32 [n + 1]
    edge_lo: np.ndarray   # int32 [B]: the edge's first class
    edge_hi: np.ndarray   # int32 [B]: its last class
    edge_to: np.ndarray   # int32 [B]
    class_of: np.ndarray  # uint8 [256]: byte -> class, ascending with the byte

    @property
    def num_nodes(self) -> int:
        return len(self.eps_ptr) - 1

    @property
    def num_classes(self) -> int:
        return int(self.class_of[-1]) + 1


def parse_indexed(pattern: str) -> rt.Node:
    """The tree of a pattern that ends in `\\z` (a full match), without the `\\z`. One in
    token_index.indexed_pattern's form (a sentinel, then the regex as a group) parses its regex
    alone: the same tree, and one that regex.tree has cached (a JSON Schema's size check parsed it)."""
    indexed = _INDEXED.fullmatch(pattern)
    if indexed:
        return rt.Seq((rt.Atom(indexed.group(1)), rt.parse(indexed.group(2))))
    node = rt.parse(pattern)
    items = node.items if isinstance(node, rt.Seq) else (node,)
    if not items or not isinstance(items[-1], rt.Atom) or items[-1].text != "\\z":
        raise Unsupported("a pattern not anchored at its end")
    return rt.Seq(items[:-1])


def build_nfa(pattern: str) -> ByteNFA:
    """The NFA of a `\\z`-anchored pattern; raises Unsupported (TooManyNodes past MAX_NFA_NODES),
    and Unsupported where the native library is missing (the caller keeps outlines-core's DFA)."""
    try:
        tree = parse_indexed(pattern)
    except (rt.GrammarError, ValueError, IndexError) as e:
        raise Unsupported(str(e)) from None
    lib = native.library()
    if lib is None:
        raise Unsupported("the grammar's native library is not available")
    prog, atom_ptr, atoms = tree_program(tree)
    status, accept = ctypes.c_int32(), ctypes.c_int32()
    handle = lib.nfa_build(prog.ctypes.data, atom_ptr.ctypes.data, atoms.ctypes.data, MAX_NFA_NODES,
                           ctypes.byref(status), ctypes.byref(accept))
    if not handle:
        raise MemoryError("out of memory for a regex's NFA")
    try:
        if status.value == NFA_TOO_MANY_NODES:
            raise TooManyNodes(f"more than {MAX_NFA_NODES:,} NFA nodes")
        if status.value != 0:
            raise MemoryError("out of memory for a regex's NFA")
        eps_p, edges_p = ctypes.POINTER(ctypes.c_int32)(), ctypes.POINTER(ctypes.c_int32)()
        num_eps, num_edges = ctypes.c_int64(), ctypes.c_int64()
        num_nodes = lib.nfa_result(handle, ctypes.byref(eps_p), ctypes.byref(num_eps), ctypes.byref(edges_p),
                                   ctypes.byref(num_edges))
        class_of = np.empty(256, dtype=np.uint8)
        eps_ptr, edge_ptr = np.empty(num_nodes + 1, dtype=np.int32), np.empty(num_nodes + 1, dtype=np.int32)
        eps_to = np.empty(num_eps.value, dtype=np.int32)
        edge_lo, edge_hi, edge_to = (np.empty(num_edges.value, dtype=np.int32) for _ in range(3))
        lib.nfa_csr(handle, *(a.ctypes.data for a in (class_of, eps_ptr, eps_to, edge_ptr, edge_lo, edge_hi, edge_to)))
    finally:
        lib.nfa_free(handle)
    return ByteNFA(0, accept.value, eps_ptr, eps_to, edge_ptr, edge_lo, edge_hi, edge_to, class_of)


OP_ATOM, OP_SEQ, OP_ALT, OP_REPEAT, OP_REF = range(5)
NFA_TOO_MANY_NODES = -2


def tree_program(tree: rt.Node) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int32 program, int32 atom offsets, int32 atoms): nfa_build.c's input (its header comment)."""
    prog: list[int] = []
    emitted: dict[int, int] = {}  # id of a composite node -> where it was emitted (the parse shares subtrees)
    atom_ids: dict[str, int] = {}
    atom_ptr: list[int] = []
    atoms: list[int] = []

    def emit(node: rt.Node) -> None:
        at = len(prog)
        if isinstance(node, rt.Atom):
            a = atom_ids.get(node.text)
            if a is None:
                a = atom_ids[node.text] = len(atom_ptr)
                atom_ptr.append(len(atoms))
                seqs = atom_sequences(node.text)
                atoms.append(len(seqs))
                for seq in seqs:
                    atoms.append(len(seq))
                    atoms.extend(b for pair in seq for b in pair)
            prog.extend((OP_ATOM, a, 0, 4))
            return
        if id(node) in emitted:
            prog.extend((OP_REF, emitted[id(node)], 0, 4))
            return
        emitted[id(node)] = at
        if isinstance(node, rt.Seq):
            prog.extend((OP_SEQ, len(node.items), 0, 0))
            children = node.items
        elif isinstance(node, rt.Alt):
            prog.extend((OP_ALT, len(node.options), 0, 0))
            children = node.options
        else:
            if node.hi is not None and node.hi < node.lo:
                raise Unsupported("a repetition whose bounds are reversed")
            prog.extend((OP_REPEAT, node.lo, -1 if node.hi is None else node.hi, 0))
            children = (node.item,)
        for child in children:
            emit(child)
        prog[at + 3] = len(prog) - at

    emit(tree)
    return (np.array(prog, dtype=np.int32), np.array(atom_ptr or [0], dtype=np.int32),
            np.array(atoms or [0], dtype=np.int32))


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
