"""A lazy token index: the regex's byte-level DFA plus the vocabulary's token trie; the tokens a
state allows are found on demand by walking the trie through the DFA (see TokenIndex).

outlines-core's `Index(regex, vocabulary)` walks the whole vocabulary from every DFA state at
compile time (~0.3-0.5 ms a state with a 49k vocabulary, thousands of states for a JSON schema).
Here the DFA of the same language comes from regex.nfa's NFA determinized in C (whole, or on
demand: grammar/regex/lazy_dfa.py), or, for syntax regex.nfa does not read, from an outlines-core Index
over a vocabulary of the 256 single bytes, and a token is allowed in a state exactly when
outlines-core would allow it: its bytes, read one by one from that state, never reach the dead
state. A state's mask is then
one depth-first walk of the token trie that skips a subtree at its first dead byte (C, in
grammar/csrc/token_trie.c; numpy where no compiler works or GDSERVE_NATIVE_GRAMMAR=0), done when a
matcher first reaches the state.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple
from itertools import chain

import numpy as np
from outlines_core import Index, Vocabulary

from gdserve.grammar import native
from gdserve.grammar.bounded_cache import BoundedCache
from gdserve.grammar.errors import RegexTooLargeError
from gdserve.grammar.regex.nfa import ByteNFA, TooManyNodes, Unsupported, build_nfa
from gdserve.grammar.vocabulary import START_TEXT
from gdserve.kernels.bitmask import bitmask_width, empty_words, pack_words, set_bits

BYTE_EOS = 256
UNREACHABLE = np.iinfo(np.int64).max // 2
MIN_LOOP_BYTES = 32   # a state looping on this many bytes takes its pure subtrees at once
LOOP_DEPTH = 3        # loop states looked for this many bytes into a walk
COUNT_DEPTH = 16      # or this many along a count down (a bounded string)
MIN_RUN = 2           # a count down shorter than this many bytes is walked node by node
MAX_LOOPS = 32        # loop states find_loops lists at most (token_trie.c's MAX_LOOPS)
MAX_CACHED_LOOPS = 64          # byte sets whose pure subtrees a trie keeps
MAX_CACHED_PURE_ROWS = 1024    # (byte set, length, width) rows a trie keeps (6 KB each at 49k tokens)
MAX_CACHED_LOOP_STATES = 4096  # states whose loops an index keeps
MAX_DFA_STATES = 1 << 20      # a regex whose DFA passes this is refused
BYTE_VOCABULARY = Vocabulary(BYTE_EOS, {bytes([b]): [b] for b in range(256)})


def mask_library() -> ctypes.CDLL | None:
    """The grammar's native library (its functions' signatures bound), or None for the numpy walk."""
    return native.library()


@dataclass(frozen=True, eq=False)
class ByteDFA:
    """A DFA over bytes with states 0..dead; `dead` (the last) is absorbing and never accepts."""
    classes: np.ndarray   # uint8 [256]: byte -> byte class (bytes no state tells apart share one)
    trans: np.ndarray     # int32 [dead + 1, C]: next state by (state, class)
    final: np.ndarray     # bool [dead + 1]: accepting (EOS allowed)
    start: int            # outlines-core's start (an index reads START_TEXT first: start_state; a terminal begins after it)
    # Where its states from `offset` on are another DFA's (a key's terminal: its value's DFA after
    # the key's bytes, which keys with values alike share; cfg.lexer): (that DFA, offset).
    tail: tuple["ByteDFA", int] | None = None

    complete = True  # every state is in the table (grammar/regex/lazy_dfa.py's are built on demand)
    generation = 0   # the table never changes (a lazy DFA's count the times it grew)
    moves = 0        # nor moves (a lazy DFA's count the times its arrays moved)

    def reaches(self, state: int, ok: np.ndarray) -> bool:
        """Whether reading only bytes b with ok[b] (bool [256]) leads from `state` to an
        accepting state: breadth-first over the table."""
        classes = np.unique(self.classes[ok])
        seen = np.zeros(len(self.final), dtype=bool)
        seen[[state, self.dead]] = True
        frontier = np.array([state])
        while frontier.size:
            if self.final[frontier].any():
                return True
            nxt = np.unique(self.trans[np.ix_(frontier, classes)])
            frontier = nxt[~seen[nxt]]
            seen[frontier] = True
        return False

    @property
    def dead(self) -> int:
        return len(self.final) - 1

    def prepare(self, state: int, depth: int) -> None:
        """Have the table hold the states within `depth` bytes of `state` (it holds them all;
        a lazy DFA builds them)."""

    def expand_all(self) -> None:
        """Have the table hold every state (it does)."""

    @cached_property
    def max_distance(self) -> int:
        """The largest finite distance of any state (0 where none is finite)."""
        finite = self.distance[self.distance < UNREACHABLE]
        return int(finite.max()) if len(finite) else 0

    def walk(self, state: int, data: bytes) -> int:
        """The state after reading `data` from `state` (dead if it dies on the way)."""
        trans, classes = self.trans, self.classes
        for b in data:
            state = trans.item(state, classes.item(b))
        return state

    @cached_property
    def distance(self) -> np.ndarray:
        """int64 [dead + 1]: the fewest bytes from each state to an accepting one (UNREACHABLE
        where none can be reached). Breadth-first from the accepting states over reversed edges
        (in C where the native library loads)."""
        lib = mask_library()
        if lib is None:
            return _table_distances(self.trans, self.final, self.dead)
        trans = np.ascontiguousarray(self.trans, dtype=np.int32)
        final = np.ascontiguousarray(self.final, dtype=np.uint8)
        dist = np.empty(len(final), dtype=np.int64)
        if lib.table_distances(trans.ctypes.data, trans.shape[0], trans.shape[1], final.ctypes.data,
                               UNREACHABLE, dist.ctypes.data) != 0:
            raise MemoryError("out of memory for a DFA's distances")
        dist[self.dead] = UNREACHABLE
        return dist


def _table_distances(trans: np.ndarray, final: np.ndarray, dead: int) -> np.ndarray:
    """ByteDFA.distance in numpy (where no native library loads)."""
    num_states, num_classes = trans.shape
    src = np.repeat(np.arange(num_states), num_classes)
    dst = trans.ravel()
    order = np.argsort(dst, kind="stable")
    preds = src[order]                                   # predecessors grouped by target
    starts = np.searchsorted(dst[order], np.arange(num_states + 1))
    dist = np.full(num_states, UNREACHABLE, dtype=np.int64)
    frontier = np.flatnonzero(final)
    dist[frontier] = 0
    level = 0
    while len(frontier):
        level += 1
        lo, hi = starts[frontier], starts[frontier + 1]
        counts = hi - lo
        idx = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        candidates = np.unique(preds[idx])
        frontier = candidates[dist[candidates] == UNREACHABLE]
        dist[frontier] = level
    dist[dead] = UNREACHABLE
    return dist


def build_byte_dfa(pattern: str) -> ByteDFA:
    """The DFA of `pattern` (indexed_pattern's form: a full match) as a dense table: regex.nfa's
    NFA determinized in C where it reads the syntax and the native kernels load (RegexTooLargeError
    past MAX_DFA_STATES), else outlines-core's (which raises a ValueError for a bad regex). Both
    give the same language."""
    lib = mask_library()
    try:
        nfa = None if lib is None else build_nfa(pattern)
    except TooManyNodes as e:
        raise _too_large(str(e)) from None
    except Unsupported:
        nfa = None
    if nfa is None:
        return outlines_byte_dfa(pattern)
    dfa = determinize(lib, nfa)
    if dfa is None:
        raise _too_large(f"more than {MAX_DFA_STATES:,} DFA states")
    return dfa


def _too_large(size: str) -> RegexTooLargeError:
    """A constraint whose automaton is refused by size (outlines-core's would be no smaller, and
    its construction aborts the process where memory runs out)."""
    return RegexTooLargeError(f"a part of the constraint needs an automaton of {size}: bounded repetitions "
                              "nested in each other multiply ({m,n} inside {m,n}, maxItems over "
                              "maxLength); lower or drop some of those bounds")


def determinize(lib: ctypes.CDLL, nfa: ByteNFA) -> ByteDFA | None:
    """Every state of the NFA's subset construction (grammar/csrc/byte_dfa.c), the dead state
    moved last; None where it passes MAX_DFA_STATES."""
    handle = new_builder(lib, nfa)
    if not handle:
        return None
    try:
        n = lib.byte_dfa_expand_all(handle)
        if n < 0:
            return None
        trans, final, dist, _, _ = builder_arrays(lib, handle, nfa.num_classes, n)
        table = np.where(trans[1:], trans[1:] - 1, n - 1).astype(np.int32)
        table = np.concatenate([table, np.full((1, nfa.num_classes), n - 1, dtype=np.int32)])
        final = np.concatenate([final[1:], [False]])
        dist = np.concatenate([dist[1:], [UNREACHABLE]])
    finally:
        lib.byte_dfa_free(handle)
    trans, merged = byte_classes(table)
    dfa = ByteDFA(merged[nfa.class_of], trans, final, 0)
    dfa.__dict__["distance"] = dist  # the construction knows each state's (its NFA nodes' least)
    return dfa


def new_builder(lib: ctypes.CDLL, nfa: ByteNFA) -> int | None:
    """A byte_dfa.c builder of the NFA (free it with byte_dfa_free; the NFA's arrays must outlive
    it), or None where memory ran out."""
    arrays = (nfa.eps_ptr, nfa.eps_to, nfa.edge_ptr, nfa.edge_lo, nfa.edge_hi, nfa.edge_to)
    return lib.byte_dfa_new(nfa.num_nodes, nfa.start, nfa.accept, nfa.num_classes, *map(_ptr, arrays),
                            MAX_DFA_STATES)


def builder_arrays(lib: ctypes.CDLL, handle: int, num_classes: int, n: int) -> tuple[np.ndarray, ...]:
    """Views of a builder's (trans [n, C], final [n], distance [n], expanded [n], the expansion
    order), state 0 dead, n at most its capacity; valid while the capacity stays (they do not
    own the memory)."""
    ptrs = [ctypes.c_void_p() for _ in range(5)]
    n_order = lib.byte_dfa_arrays(handle, *map(ctypes.byref, ptrs))
    shapes = [((n, num_classes), np.int32), (n, np.bool_), (n, np.int64), (n, np.bool_), (n_order, np.int32)]
    return tuple(np.ndarray(shape, dtype, _buffer(ptr.value, int(np.prod(shape)) * np.dtype(dtype).itemsize))
                 if np.prod(shape) else np.zeros(shape, dtype) for ptr, (shape, dtype) in zip(ptrs, shapes))


def _buffer(address: int, size: int):
    return (ctypes.c_char * size).from_address(address)


def outlines_byte_dfa(pattern: str) -> ByteDFA:
    """The DFA outlines-core builds for `pattern` (raises its ValueError), as a dense table."""
    index = Index(pattern, BYTE_VOCABULARY)
    edges = index.get_transitions()
    start = index.get_initial_state()
    counts = [len(e) for e in edges.values()]
    src = np.repeat(np.fromiter(edges, dtype=np.int64, count=len(edges)), counts)
    byte = np.fromiter(chain.from_iterable(edges.values()), dtype=np.int64, count=len(src))
    dst = np.fromiter(chain.from_iterable(e.values() for e in edges.values()), dtype=np.int64,
                      count=len(src))
    states = np.unique(np.concatenate([[start], src, dst]))
    dead = len(states)
    keep = byte != BYTE_EOS
    table = np.full((dead + 1, 256), dead, dtype=np.int32)
    table[np.searchsorted(states, src[keep]), byte[keep]] = np.searchsorted(states, dst[keep])
    final = np.zeros(dead + 1, dtype=bool)
    final[np.searchsorted(states, np.array(list(index.get_final_states()), dtype=np.int64))] = True
    trans, classes = byte_classes(table)
    return ByteDFA(classes, trans, final, int(np.searchsorted(states, start)))


def byte_classes(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [S, C] one column per class, uint8 [256] byte -> class): bytes whose columns of
    `table` are equal share a class, numbered in order of their first byte."""
    ids: dict[bytes, int] = {}
    classes = np.array([ids.setdefault(col.tobytes(), len(ids)) for col in np.ascontiguousarray(table.T)],
                       dtype=np.uint8)
    first = np.unique(classes, return_index=True)[1]
    return np.ascontiguousarray(table[:, first]), classes


@dataclass(eq=False)
class TokenTrie:
    """Every token's bytes in one trie, nodes in depth-first preorder (a node's subtree is the
    nodes up to skip[node]); per tokenizer, shared by its grammars (interned by fingerprint when
    unpickled)."""
    fingerprint: str
    byte: np.ndarray        # uint8 [N]: the byte on the edge into each node
    depth: np.ndarray       # int32 [N]: 1 for the root's children
    skip: np.ndarray        # int32 [N]: the first node after each node's subtree
    parent: np.ndarray      # int32 [N]: -1 for depth 1
    tok_ptr: np.ndarray     # int32 [N + 1]: tok_ids[tok_ptr[i]:tok_ptr[i + 1]] end at node i
    tok_ids: np.ndarray     # int32 [T]
    token_node: np.ndarray  # int32 [V]: where each token id ends; -1 for none (special, EOS)
    token_data: bytes = field(repr=False)  # token_data[offsets[i]:offsets[i + 1]]: token i's bytes
    offsets: np.ndarray = field(repr=False)  # int64 [V + 1]
    _pure: BoundedCache[bytes, tuple[np.ndarray, int]] = field(
        default_factory=lambda: BoundedCache(MAX_CACHED_LOOPS), repr=False)
    _pure_tokens: BoundedCache[bytes, np.ndarray] = field(
        default_factory=lambda: BoundedCache(MAX_CACHED_LOOPS), repr=False)
    _pure_rows: BoundedCache[tuple[bytes, int, int], tuple[np.ndarray, int]] = field(
        default_factory=lambda: BoundedCache(MAX_CACHED_PURE_ROWS), repr=False)
    _first_words: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __reduce__(self):
        return _intern_trie, tuple(getattr(self, name) for name in _TRIE_FIELDS)

    @property
    def size(self) -> int:
        return len(self.token_node)

    def token_bytes(self, token_id: int) -> bytes:
        return self.token_data[self.offsets[token_id]:self.offsets[token_id + 1]]

    def first_byte_words(self, vocab_size: int) -> np.ndarray:
        """uint32 [256, ceil(vocab_size / 32)]: the tokens below vocab_size whose first byte is b
        (shared by the tokenizer's grammars)."""
        out = self._first_words.get(vocab_size)
        if out is None:
            out = np.zeros((256, bitmask_width(vocab_size)), dtype=np.uint32)
            starts = np.flatnonzero(self.depth == 1)
            for node, first in zip(starts.tolist(), self.byte[starts].tolist()):
                ids = self.tok_ids[self.tok_ptr[node]:self.tok_ptr[self.skip[node]]]
                set_bits(out[first], ids[ids < vocab_size])
            self._first_words[vocab_size] = out
        return out

    def pure_below(self, loop: bytes) -> tuple[np.ndarray, int]:
        """(uint8 [N]: 1 where every node below the node (strictly) reads a byte in `loop` (a byte
        set, np.packbits of bool [256]), its address). Cached per byte set (grammars share their
        strings' few character sets)."""
        pure = self._pure.get(loop)
        if pure is None:
            inside = _unpack_set(loop)
            outside = np.concatenate([[0], np.cumsum(~inside[self.byte], dtype=np.int32)])
            nodes = np.arange(len(self.byte))
            array = (outside[self.skip] == outside[nodes + 1]).astype(np.uint8)
            pure = self._pure.put(loop, (array, _ptr(array)))
        return pure

    def pure_row(self, loop: bytes, max_len: int, vocab_size: int) -> tuple[np.ndarray, int]:
        """(uint32 [ceil(vocab_size / 32)] packed tokens below vocab_size whose bytes all lie in
        `loop` (a byte set as in pure_below) and number at most max_len, their count): a string
        state's tokens but the few that leave the string, shared by every state and grammar
        that reads the set (cached; read, never modify)."""
        key = (loop, max_len, vocab_size)
        row = self._pure_rows.get(key)
        if row is None:
            keep = self.pure_lengths(loop)[:vocab_size] <= max_len
            row = self._pure_rows.put(key, (pack_words(keep, vocab_size), int(keep.sum())))
        return row

    def pure_lengths(self, loop: bytes) -> np.ndarray:
        """int32 [V]: each token's length where its bytes all lie in `loop`, else a length no
        max_len reaches (tokens without bytes included); cached per byte set."""
        lengths = self._pure_tokens.get(loop)
        if lengths is None:
            inside = _unpack_set(loop)
            data = np.frombuffer(self.token_data, dtype=np.uint8)
            outside = np.concatenate([[0], np.cumsum(~inside[data], dtype=np.int64)])
            lengths = np.diff(self.offsets)
            pure = (outside[self.offsets[1:]] == outside[self.offsets[:-1]]) & (lengths > 0) & (self.token_node >= 0)
            lengths = self._pure_tokens.put(loop, np.where(pure, lengths, np.iinfo(np.int32).max).astype(np.int32))
        return lengths

    def greedy_count(self, text: bytes, vocab_size: int) -> int | None:
        """Tokens in the greedy tokenization of `text` (from each position the longest token below
        vocab_size that the rest starts with), None where no token starts at some position. An
        upper bound on the fewest tokens that spell the text, and for text a grammar accepts, on
        the tokens its masks need to follow it: a mask allows every token whose bytes it accepts."""
        lib = mask_library()
        if lib is not None:
            count = lib.greedy_token_count(*self._greedy_args, vocab_size, text, len(text))
            return None if count < 0 else count
        tokens = self.greedy_tokens(text, vocab_size)
        return None if tokens is None else len(tokens)

    def greedy_tokens(self, text: bytes, vocab_size: int) -> list[int] | None:
        """The greedy tokenization greedy_count counts (the lowest id where tokens share their
        bytes), walked down the preorder trie in Python."""
        i, out = 0, []
        while i < len(text):
            longest, node, j = None, int(self.first_nodes[text[i]]), 0
            while node >= 0:
                ids = self.tok_ids[self.tok_ptr[node]:self.tok_ptr[node + 1]]
                ids = ids[ids < vocab_size]
                if len(ids):
                    longest = (j + 1, int(ids.min()))
                j += 1
                node = self._child(node, text[i + j]) if i + j < len(text) else -1
            if longest is None:
                return None
            i += longest[0]
            out.append(longest[1])
        return out

    def _child(self, node: int, b: int) -> int:
        child, end = node + 1, int(self.skip[node])
        while child < end and self.byte[child] != b:
            child = int(self.skip[child])
        return child if child < end else -1

    @cached_property
    def _greedy_args(self) -> tuple[int, ...]:
        return tuple(map(_ptr, (self.byte, self.skip, self.first_nodes, self.tok_ptr, self.tok_ids)))

    @cached_property
    def first_nodes(self) -> np.ndarray:
        """int32 [256]: the depth-1 node reading each byte (-1: none)."""
        out = np.full(256, -1, dtype=np.int32)
        starts = np.flatnonzero(self.depth == 1)
        out[self.byte[starts]] = starts
        return out

    @cached_property
    def max_depth(self) -> int:
        return int(self.depth.max())

    @cached_property
    def single_bytes(self) -> np.ndarray:
        """bool [256]: the bytes that are a token by themselves."""
        out = np.zeros(256, dtype=bool)
        out[self.byte[(self.depth == 1) & (self.tok_ptr[1:] > self.tok_ptr[:-1])]] = True
        return out

    @cached_property
    def below(self) -> np.ndarray:
        """int32 [N]: the most bytes a token reads below the node (0 at a leaf)."""
        below = np.zeros(len(self.byte), dtype=np.int32)
        for nodes in reversed(self.levels[1:]):
            np.maximum.at(below, self.parent[nodes], below[nodes] + 1)
        return below

    @cached_property
    def levels(self) -> list[np.ndarray]:
        """The nodes at each depth (level-order, for the numpy walk)."""
        order = np.argsort(self.depth, kind="stable")
        bounds = np.searchsorted(self.depth[order], np.arange(1, int(self.depth.max()) + 2))
        return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


_TRIE_FIELDS = ("fingerprint", "byte", "depth", "skip", "parent", "tok_ptr", "tok_ids",
                "token_node", "token_data", "offsets")
_TRIES: dict[str, TokenTrie] = {}  # by vocabulary fingerprint, one per tokenizer in a process


def _intern_trie(fingerprint: str, *arrays) -> TokenTrie:
    if fingerprint not in _TRIES:
        _TRIES[fingerprint] = TokenTrie(fingerprint, *arrays)
    return _TRIES[fingerprint]


def token_trie(token_bytes: tuple[bytes | None, ...], fingerprint: str) -> TokenTrie:
    """The trie of a vocabulary's token bytes (None: no bytes, never allowed); cached."""
    if fingerprint not in _TRIES:
        _TRIES[fingerprint] = _build_trie(token_bytes, fingerprint)
    return _TRIES[fingerprint]


def _build_trie(token_bytes: tuple[bytes | None, ...], fingerprint: str) -> TokenTrie:
    ids_by_bytes: dict[bytes, list[int]] = {}
    for token_id, b in enumerate(token_bytes):
        if b:
            ids_by_bytes.setdefault(b, []).append(token_id)
    byte, depth, tok_ptr, tok_ids = [], [], [0], []
    token_node = np.full(len(token_bytes), -1, dtype=np.int32)
    prev = b""
    # In sorted order, the prefixes a token shares with earlier ones are those it shares with the
    # one just before it, so its new nodes are the rest (at least its last byte: no key is a
    # prefix of an earlier one): appended in order, that is preorder. tok_ptr[i + 1] ends node i.
    for data in sorted(ids_by_bytes):
        shared = len(os.path.commonprefix([prev, data]))
        for k in range(shared, len(data)):
            byte.append(data[k])
            depth.append(k + 1)
            tok_ptr.append(len(tok_ids))
        tok_ids.extend(ids_by_bytes[data])
        tok_ptr[-1] = len(tok_ids)
        token_node[ids_by_bytes[data]] = len(byte) - 1
        prev = data
    depth_arr = np.array(depth, dtype=np.int32)
    skip, parent = _skip_and_parent(depth_arr)
    offsets = np.zeros(len(token_bytes) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b or b"") for b in token_bytes])
    return TokenTrie(fingerprint, np.array(byte, dtype=np.uint8), depth_arr, skip, parent,
                     np.array(tok_ptr, dtype=np.int32), np.array(tok_ids, dtype=np.int32), token_node,
                     b"".join(b or b"" for b in token_bytes), offsets)


def _skip_and_parent(depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(depth)
    skip = np.full(n, n, dtype=np.int32)
    parent = np.full(n, -1, dtype=np.int32)
    stack: list[int] = []
    for i, d in enumerate(depth.tolist()):
        while stack and depth[stack[-1]] >= d:
            skip[stack.pop()] = i
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return skip, parent


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _unpack_set(byte_set: bytes) -> np.ndarray:
    """bool [256] of a byte set packed as np.packbits packs it."""
    return np.unpackbits(np.frombuffer(byte_set, dtype=np.uint8)).astype(bool)


class Loops(NamedTuple):
    """A walk's loop states (TokenIndex.loops) as the C walks take them."""
    states: np.ndarray            # int32
    pures: list[np.ndarray]       # trie.pure_below of each one's byte set
    limits: np.ndarray            # int32: bytes of the set each reads (INT32_MAX: unbounded)
    pointers: np.ndarray          # uintp: the pures' addresses
    args: tuple[int, ...]         # the count and the three arrays' addresses
    # The base row, where the walk's state has one (find_loops finds it, see TokenIndex.loops):
    # its trie.pure_row (byte set, most bytes), set before the walk, which then skips the
    # subtrees it covers; and the C walk's base arguments (the addresses of base_classes and of
    # the set's pure_below array, base_len; None, None, 0 without).
    base_row: tuple[bytes, int] | None = None
    base_args: tuple = (None, None, 0)
    base_classes: np.ndarray | None = None  # uint8 [C]: 1 for the classes of the base row's bytes


def _as_loops(states: np.ndarray, pures: list[tuple[np.ndarray, int]], limits: np.ndarray,
              base_row: tuple[bytes, int] | None = None, base_classes: np.ndarray | None = None,
              base_pure: tuple[np.ndarray, int] | None = None, walk_len: int = 0) -> Loops:
    """pures, base_pure: (array, address) pairs, as trie.pure_below gives them; walk_len: the
    C walk's base_len (the base row's most bytes, or INT32_MAX where more of them are dead)."""
    pointers = np.array([address for _, address in pures] or [0], dtype=np.uintp)
    base_args = (None, None, 0) if base_row is None else (_ptr(base_classes), base_pure[1], walk_len)
    return Loops(states, [array for array, _ in pures], limits, pointers,
                 (len(pures), _ptr(states), _ptr(pointers), _ptr(limits)), base_row, base_args, base_classes)


# What a TokenIndex reads from its DFA's arrays and keeps: addresses (stale once the arrays move)
# and copies (stale once states are added).
_DFA_ADDRESSES = ("_static_args", "_loop_scratch")
_DFA_COPIES = ("_distance_or_dead",)
NO_LOOPS = _as_loops(np.zeros(0, dtype=np.int32), [], np.zeros(0, dtype=np.int32))


@dataclass(eq=False)
class TokenIndex:
    """A ByteDFA over a TokenTrie: the allowed tokens of a state, on demand. Pickles without its
    loop memo (the trie's pure arrays are rebuilt where they are needed) and array addresses."""
    dfa: ByteDFA
    trie: TokenTrie

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_loops", "_based", "_tables", "_static_args", "_class_bytes_ptr", "_scratch",
                             "_loop_scratch", "_distance_or_dead", "_node_state_scratch", "_dfa_generation")}

    def prepare(self, state: int) -> None:
        """Have the DFA hold every state a walk from `state` reads (a lazy DFA builds them);
        where it grew, what was read from its arrays is read again."""
        self.dfa.prepare(state, self.trie.max_depth)
        self._check_generation()

    def expand_all(self) -> None:
        """Have the DFA hold every state (a lazy DFA builds them all)."""
        self.dfa.expand_all()
        self._check_generation()

    def _check_generation(self) -> None:
        """Forget what was read from the DFA's arrays where it grew since (a matcher's step may
        grow it too, between walks)."""
        seen = self.__dict__.get("_dfa_generation", (0, 0))
        now = (self.dfa.generation, self.dfa.moves)
        if seen != now:
            stale = _DFA_COPIES + (_DFA_ADDRESSES if seen[1] != now[1] else ())
            for name in stale:
                self.__dict__.pop(name, None)
            self._dfa_generation = now

    @cached_property
    def node_class(self) -> np.ndarray:
        """uint8 [N]: each trie node's byte class in this DFA."""
        return np.ascontiguousarray(self.dfa.classes[self.trie.byte])

    @cached_property
    def _class_bytes(self) -> np.ndarray:
        return np.bincount(self.dfa.classes, minlength=self.dfa.trans.shape[1]).astype(np.int32)

    @cached_property
    def _class_bytes_ptr(self) -> int:
        return _ptr(self._class_bytes)

    @cached_property
    def _loops(self) -> BoundedCache[int, Loops]:
        return BoundedCache(MAX_CACHED_LOOP_STATES)

    @cached_property
    def _scratch(self) -> tuple[tuple[np.ndarray, ...], tuple[int, ...]]:
        """The C walks' stack and their crossings out (nodes, terminals, count), one set per index
        (walks run one at a time), and the addresses."""
        n = len(self.trie.byte)
        arrays = (np.empty(self.trie.max_depth + 1, dtype=np.int32), np.empty(n, dtype=np.int32),
                  np.empty(n, dtype=np.int32), np.zeros(1, dtype=np.int64),
                  np.empty(self.trie.max_depth + 1, dtype=np.uint8))
        return arrays, tuple(map(_ptr, arrays))

    def loops(self, state: int, accept: np.ndarray | None = None, split: bool = False) -> Loops:
        """The walk's loop states, their trie.pure_below arrays and how many bytes of their set
        each reads (C walks only): `state` and the states that most bytes lead to, one and two
        bytes on (a key's first character, then the rest of an undeclared key; up to COUNT_DEPTH
        along a count down), where at least MIN_LOOP_BYTES bytes lead back to the state (a
        string's interior: unbounded) or on to one state, byte after byte (a string of at most n
        characters: as far as that goes). With `split`, through states that complete no terminal
        (accept). Where exactly the bytes of one such set lead there from `state` (a string's
        state), the walk takes the base row instead (see Loops; the table would save it little,
        and what a first visit costs is mostly building it). An index is walked with one accept
        and split; a state's row never changes once walked (the lexer grows by new states)."""
        out = self._loops.get(state)
        if out is None:
            self.prepare(state)
            n, base = self._find_loops(state, accept, split)
            out = self._loops.put(state, self._based_loops(*base) if base else self._loop_table(n))
        return out

    def _find_loops(self, state: int, accept: np.ndarray | None, split: bool) -> tuple[int, tuple | None]:
        """find_loops into the scratch arrays: (how many loops, the base row's (byte set, most,
        base_len) or None)."""
        (_, _, sets, base), args = self._loop_scratch
        n = mask_library().find_loops(*args[:5], None if accept is None else _ptr(accept), split, state, *args[5:])
        return n, (sets[base[0]].tobytes(), int(base[1]), int(base[2])) if base[0] >= 0 else None

    def _loop_table(self, n: int) -> Loops:
        """The Loops of the n loops find_loops last wrote (no base row)."""
        found, limits, sets, _ = self._loop_scratch[0]
        return NO_LOOPS if n == 0 else _as_loops(
            found[:n].copy(), [self.trie.pure_below(sets[i].tobytes()) for i in range(n)], limits[:n].copy())

    def _subtree_loops(self, state: int, accept: np.ndarray, split: bool) -> Loops:
        """The loop table of a walk over subtrees, which take no base row: a based state's loops()
        has none, so it is built here (cached apart)."""
        out = self.loops(state, accept, split)
        if out.base_row is None:
            return out
        table = self._tables.get(state)
        if table is None:
            table = self._tables.put(state, self._loop_table(self._find_loops(state, accept, split)[0]))
        return table

    @cached_property
    def _tables(self) -> BoundedCache[int, Loops]:
        return BoundedCache(MAX_CACHED_LOOP_STATES)

    def _based_loops(self, byte_set: bytes, most: int, walk_len: int) -> Loops:
        """The Loops of a walk from a state with a base row (no loop table), shared by the
        states of every string of that set, length left and ending."""
        key = (byte_set, most, walk_len)
        out = self._based.get(key)
        if out is None:
            classes = np.zeros(self.dfa.trans.shape[1], dtype=np.uint8)
            classes[self.dfa.classes[_unpack_set(byte_set)]] = 1  # loop sets are unions of classes
            out = self._based[key] = _as_loops(NO_LOOPS.states, [], NO_LOOPS.limits, (byte_set, most), classes,
                                               self.trie.pure_below(byte_set), walk_len)
        return out

    @cached_property
    def _based(self) -> dict[tuple[bytes, int, int], Loops]:
        return {}

    @cached_property
    def _loop_scratch(self) -> tuple[tuple[np.ndarray, ...], tuple]:
        """find_loops' out arrays (states, limits, byte sets, base row) and its arguments but
        accept, split and state."""
        arrays = (np.empty(MAX_LOOPS, dtype=np.int32), np.empty(MAX_LOOPS, dtype=np.int32),
                  np.empty((MAX_LOOPS, 32), dtype=np.uint8), np.empty(3, dtype=np.int32))
        trans, classes, dead = self._static_args[:3]
        return arrays, (trans, classes, dead, self._class_bytes_ptr, _ptr(self.dfa.classes), LOOP_DEPTH, COUNT_DEPTH,
                        MIN_LOOP_BYTES, MIN_RUN, self.trie.max_depth, *map(_ptr, arrays))

    @cached_property
    def _static_args(self) -> tuple:
        """The C walks' arguments for the DFA's table and the trie's arrays, which never change
        for an index (a grown lexer gets a new one); never pickled: a pickled index must not
        carry another process's addresses."""
        t, trans = self.trie, self.dfa.trans
        return (_ptr(trans), trans.shape[1], self.dfa.dead, _ptr(self.node_class), _ptr(t.depth),
                _ptr(t.skip), _ptr(t.tok_ptr), _ptr(t.tok_ids), _ptr(t.below))

    def allowed_words(self, state: int, vocab_size: int) -> tuple[np.ndarray, int]:
        """(uint32 [ceil(vocab_size / 32)] packed allowed tokens below vocab_size, their count)."""
        self.prepare(state)
        words = empty_words(vocab_size)
        lib = mask_library()
        if lib is None:
            allowed = self.allowed_tokens(state)
            allowed = allowed[allowed < vocab_size]
            set_bits(words, allowed)
            return words, len(allowed)
        count = self._walk_native(lib, state, vocab_size, words, None)
        return words, count

    def walk(self, state: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
        """One walk of the trie from `state`: (uint32 packed allowed tokens below vocab_size,
        int32 [N] each trie node's DFA state, dead where the walk died or never went)."""
        self.prepare(state)
        words = empty_words(vocab_size)
        lib = mask_library()
        if lib is not None:
            node_state = np.full(len(self.trie.byte), self.dfa.dead, dtype=np.int32)
            self._walk_native(lib, state, vocab_size, words, node_state)
            return words, node_state
        node_state = self._node_states(state)
        node = self.trie.token_node[:vocab_size]
        ids = np.flatnonzero((node >= 0) & (node_state[node] != self.dfa.dead))
        set_bits(words, ids)
        return words, node_state

    def crossings_walk(self, state: int, vocab_size: int, accept: np.ndarray,
                       split: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One walk of the trie from a lexer state whose DFA states emit accept[s] (-1: none):
        (uint32 packed tokens that stay alive, int32 nodes below depth 1 where the lexeme dies
        right after an accepting state, int32 accept[] there), nodes ascending. With `split`
        (lexemes may end at any complete match), every node below depth 1 whose parent accepts."""
        self.prepare(state)
        lib = mask_library()
        if lib is None:
            words, node_state = self.walk(state, vocab_size)
            t, dead = self.trie, self.dfa.dead
            below = t.depth > 1
            parent_state = np.where(below, node_state[t.parent], dead)
            terms = np.where(parent_state != dead, accept[parent_state], -1)
            keep = (terms >= 0) & (split | (node_state == dead))
            nodes = np.flatnonzero(keep)
            return words, nodes.astype(np.int32), terms[keep].astype(np.int32)
        words = empty_words(vocab_size)
        self._walk_native(lib, state, vocab_size, words, None, (np.ascontiguousarray(accept, dtype=np.int32), split))
        return (words, *self._crossings())

    def _crossings(self) -> tuple[np.ndarray, np.ndarray]:
        (_, nodes, terms, count, _), _ = self._scratch
        n = int(count[0])
        return nodes[:n].copy(), terms[:n].copy()

    def subtrees_walk(self, lib: ctypes.CDLL, state: int, roots: np.ndarray, vocab_size: int,
                      accept: np.ndarray, split: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """crossings_walk over the subtrees of `roots` only, each root's byte read from `state`
        (crossings below the roots); native only (cfg.masks has the numpy walk)."""
        accept = np.ascontiguousarray(accept, dtype=np.int32)
        roots = np.ascontiguousarray(roots, dtype=np.int32)
        words = empty_words(vocab_size)
        stack, nodes, terms, count, _ = self._scratch[1]
        trans, classes, dead, node_class, depth, skip, tok_ptr, tok_ids, below = self._static_args
        lib.walk_token_subtrees(
            trans, classes, dead, node_class, depth, skip, _ptr(roots), len(roots), tok_ptr, tok_ids,
            state, vocab_size, _ptr(words), _ptr(accept), split, nodes, terms, count,
            *self._subtree_loops(state, accept, split).args, below, stack)
        return (words, *self._crossings())

    def next_states(self, state: int) -> np.ndarray:
        """int32 [V]: each token's state after `state` (dead: not allowed; tokens without bytes
        are dead)."""
        self.prepare(state)
        node_state = self._node_states(state)
        out = np.full(self.trie.size, self.dfa.dead, dtype=np.int32)
        has = self.trie.token_node >= 0
        out[has] = node_state[self.trie.token_node[has]]
        return out

    def next_distances(self, state: int, size: int | None = None) -> np.ndarray:
        """int32 [size] (default: the trie's tokens): each token's distance to completion
        (dfa.distance, INT32_MAX where out of reach) after it from `state`; -1 where not allowed
        and for ids past the trie. The walk skips the base row's subtrees (a string's characters:
        most of the vocabulary), whose tokens' distances follow from their lengths alone."""
        self.prepare(state)
        size = self.trie.size if size is None else size
        out = np.full(size, -1, dtype=np.int32)
        n = min(size, self.trie.size)
        lib = mask_library()
        if lib is None:
            nxt = self.next_states(state)[:n]
            out[:n] = np.where(nxt != self.dfa.dead, self._distance_or_dead[nxt], -1)
            return out
        loops = self.loops(state)
        node_state = self._node_state_scratch
        node_state.fill(self.dfa.dead)  # its last entry stands for the tokens without bytes
        self._walk_native(lib, state, self.trie.size, empty_words(self.trie.size),
                          node_state, loops=loops)
        lengths, most, by_length = None, 0, None
        if loops.base_row is not None:
            byte_set, most = loops.base_row
            lengths = self.trie.pure_lengths(byte_set)
            by_length = np.empty(most + 1, dtype=np.int32)  # the state after 0..most bytes of the set
            trans, x, c = self.dfa.trans, state, int(np.flatnonzero(loops.base_classes)[0])
            for k in range(most + 1):  # one state per k (see Loops)
                by_length[k], x = self._distance_or_dead[x], trans.item(x, c)
        lib.token_distances(_ptr(node_state), len(node_state) - 1, _ptr(self.trie.token_node), n,
                            _ptr(self._distance_or_dead), None if lengths is None else _ptr(lengths), most,
                            None if by_length is None else _ptr(by_length), _ptr(out))
        return out

    @cached_property
    def _distance_or_dead(self) -> np.ndarray:
        """int32 dfa.distance, -1 for the dead state, INT32_MAX where completion is out of reach."""
        out = np.minimum(self.dfa.distance, np.iinfo(np.int32).max).astype(np.int32)
        out[self.dfa.dead] = -1
        return out

    @cached_property
    def _node_state_scratch(self) -> np.ndarray:
        """next_distances' node states (walks run one at a time), one more for the tokens without a node."""
        return np.empty(len(self.trie.byte) + 1, dtype=np.int32)

    def allowed_tokens(self, state: int) -> np.ndarray:
        """int64 ids of the allowed tokens (any id the trie holds), ascending."""
        return np.flatnonzero(self.next_states(state) != self.dfa.dead)

    def _node_states(self, state: int) -> np.ndarray:
        node_state = np.full(len(self.trie.byte), self.dfa.dead, dtype=np.int32)
        lib = mask_library()
        if lib is not None:
            words = empty_words(self.trie.size)
            self._walk_native(lib, state, self.trie.size, words, node_state)
            return node_state
        trans, node_class = self.dfa.trans, self.node_class
        for d, nodes in enumerate(self.trie.levels):
            parents = state if d == 0 else node_state[self.trie.parent[nodes]]
            node_state[nodes] = trans[parents, node_class[nodes]]
            if d and not (node_state[nodes] != self.dfa.dead).any():
                break  # dead is absorbing: every deeper node is dead too
        return node_state

    def _walk_native(self, lib: ctypes.CDLL, state: int, vocab_size: int, words: np.ndarray,
                     node_state: np.ndarray | None, crossings: tuple | None = None,
                     loops: Loops | None = None) -> int:
        """crossings: (accept, split), see crossings_walk (written to the scratch arrays). loops:
        by default the state's, or NO_LOOPS where node_state is wanted; next_distances passes
        the state's with node_state, whose base row's nodes then keep the dead state."""
        stack, nodes, terms, count, on_path = self._scratch[1]
        accept, split = (None, False) if crossings is None else crossings
        cross = [None, 0, None, None, None] if crossings is None else [_ptr(accept), split, nodes, terms, count]
        if loops is None:
            loops = self.loops(state, accept, split) if node_state is None else NO_LOOPS
        base_count = 0
        if loops.base_row is not None:
            base_words, base_count = self.trie.pure_row(*loops.base_row, vocab_size)
            np.bitwise_or(words, base_words, out=words)
        trans, classes, dead, node_class, depth, skip, tok_ptr, tok_ids, below = self._static_args
        return base_count + lib.walk_token_trie(
            trans, classes, dead, node_class, depth, skip, len(self.trie.byte), tok_ptr, tok_ids,
            state, vocab_size, _ptr(words), None if node_state is None else _ptr(node_state), *cross,
            *loops.args, below, *loops.base_args, on_path, stack)


def indexed_pattern(regex: str) -> str:
    """START_TEXT + regex, matched in full (see compiler's module docstring). Also what keeps
    outlines-core fast: a pattern that begins with `"` and a bounded repetition takes it time
    exponential in the bound (`"(?:x){0,14}"` 3 s, `{0,20}` minutes), the same after a sentinel
    milliseconds."""
    return "\\x{%X}(?:%s)\\z" % (ord(START_TEXT), regex)


def start_state(dfa: ByteDFA) -> int:
    """Where matchers begin: after the START_TEXT sentinel (see compiler.build_index)."""
    return dfa.walk(dfa.start, START_TEXT.encode())


def can_reach_final(index: TokenIndex, state: int) -> bool:
    """Whether some sequence of tokens leads from `state` to an accepting state: none where no
    bytes do; first over the bytes that are tokens by themselves (cheap, and enough for
    byte-level vocabularies), then, if that finds none, over whole tokens (a lazy DFA is built
    whole for that)."""
    if index.dfa.distance[state] >= UNREACHABLE:
        return False
    if index.dfa.reaches(state, index.trie.single_bytes):
        return True
    index.expand_all()
    return _reaches_by_tokens(index, state)


def _reaches_by_tokens(index: TokenIndex, state: int) -> bool:
    dead, seen, todo = index.dfa.dead, {state}, [state]
    while todo:
        current = todo.pop()
        if index.dfa.final[current]:
            return True
        for nxt in np.unique(index.next_states(current)).tolist():
            if nxt != dead and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False
