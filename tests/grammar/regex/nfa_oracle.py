"""The Python construction of a regex's byte NFA (Thompson's, big subtrees built once and copied):
the oracle the native construction (grammar/csrc/nfa_build.c) is held to."""
from dataclasses import dataclass

import numpy as np

from gdserve.grammar.regex import tree as rt
from gdserve.grammar.regex.nfa import MAX_NFA_NODES, ByteNFA, TooManyNodes, Unsupported, atom_sequences, parse_indexed

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
