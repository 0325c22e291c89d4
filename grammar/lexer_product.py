"""The states of the contextual lexer's product DFA (cfg_lexer.Lexer) that one candidate set's
start reaches while two or more terminals are alive: a breadth-first walk in C
(kernels/csrc/lexer_product.c), or the Python reference below where no compiler works. It
runs when a parser stack first meets a candidate set, inside a mask fill, so it is kept in C:
in numpy (~70 µs a state) it was most of a first fill's time.

The walk reads the lexer's table, which holds every terminal's own states (the states where only
that terminal is alive), and returns its states as lists of those ids."""
import ctypes
from dataclasses import dataclass
from functools import cache

import numpy as np

from gdserve.grammar.token_index import mask_library

DEAD = -1


@dataclass(frozen=True)
class Product:
    """n states: state i is members[ptr[i]:ptr[i+1]] (own-state ids, ascending); 0 is the start."""
    ptr: np.ndarray       # int32 [n + 1]
    members: np.ndarray   # int32 [ptr[n]]
    rows: np.ndarray      # int64 [n, C]: an own-state id, DEAD, or -2 - (a product state)
    best: np.ndarray      # int32 [n]: the completed terminal that is emitted (by rank), -1 if none
    n_final: np.ndarray   # int32 [n]: how many members complete a terminal


def product_index(rows: np.ndarray) -> np.ndarray:
    """The product state of entries <= -2."""
    return -2 - rows


class ProductWalk:
    """The walks of one lexer (n_classes byte classes), with buffers kept from walk to walk (the
    arrays it returns are those buffers: read them before the next walk)."""

    def __init__(self, n_classes: int) -> None:
        self.lib, self.n_classes = _library(), n_classes
        self._grow(256, 1024)

    def run(self, start: np.ndarray, trans: np.ndarray, dead: int, accept: np.ndarray,
            rank: np.ndarray) -> Product:
        """From `start` (int32 own-state ids, ascending). trans: int32 [states, n_classes], `dead`
        where the lexeme dies; accept: int32 per state, the terminal it completes (-1 none); rank:
        int64 per terminal, the order that picks the emitted one among those completed."""
        if self.lib is None:
            return _product_reference(start, trans, dead, accept, rank)
        k = len(start)
        if len(self.members) < k:
            self._grow(len(self.best), 4 * k)
        while True:
            n = self.lib.lexer_product(k, start.ctypes.data, trans.ctypes.data, self.n_classes, dead,
                                       accept.ctypes.data, rank.ctypes.data, len(self.best), len(self.members),
                                       *self._out)
            if n >= 0:
                return Product(self.ptr[:n + 1], self.members[:int(self.ptr[n])], self.rows[:n], self.best[:n],
                               self.n_final[:n])
            if n == -1:
                self._grow(4 * len(self.best), len(self.members))
            else:
                self._grow(len(self.best), 4 * len(self.members))

    def _grow(self, states: int, members: int) -> None:
        self.ptr, self.members = np.empty(states + 1, dtype=np.int32), np.empty(members, dtype=np.int32)
        self.rows = np.empty((states, self.n_classes), dtype=np.int64)
        self.best, self.n_final = np.empty(states, dtype=np.int32), np.empty(states, dtype=np.int32)
        self.table = np.empty(1 << (2 * states - 1).bit_length(), dtype=np.int32)
        self.next = np.empty(members, dtype=np.int32)
        self._out = [a.ctypes.data for a in (self.ptr, self.members, self.rows, self.best, self.n_final, self.table)]
        self._out += [len(self.table) - 1, self.next.ctypes.data]


def _product_reference(start, trans, dead, accept, rank) -> Product:
    states, index = [tuple(int(s) for s in start)], {}
    rows, best, n_final = [], [], []
    for members in states:  # grows while it is read: breadth first, as the C walk
        finals = [int(accept[s]) for s in members if accept[s] >= 0]
        best.append(min(finals, key=lambda t: rank[t]) if finals else -1)
        n_final.append(len(finals))
        row = []
        for c in range(trans.shape[1]):
            nxt = tuple(int(trans[s, c]) for s in members if trans[s, c] != dead)
            if len(nxt) < 2:
                row.append(nxt[0] if nxt else DEAD)
                continue
            if nxt not in index:
                index[nxt] = len(states)
                states.append(nxt)
            row.append(-2 - index[nxt])
        rows.append(row)
    return Product(np.cumsum([0] + [len(m) for m in states]).astype(np.int32),
                   np.array([s for m in states for s in m], dtype=np.int32),
                   np.array(rows, dtype=np.int64).reshape(len(states), trans.shape[1]),
                   np.array(best, dtype=np.int32), np.array(n_final, dtype=np.int32))


@cache
def _library() -> ctypes.CDLL | None:
    lib = mask_library()
    if lib is not None:
        p, i32 = ctypes.c_void_p, ctypes.c_int32
        lib.lexer_product.argtypes = [i32, p, p, i32, i32, p, p, i32, i32, p, p, p, p, p, p, i32, p]
        lib.lexer_product.restype = ctypes.c_int64
    return lib
