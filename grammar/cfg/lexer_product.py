"""The states of the contextual lexer's product DFA (cfg.lexer.Lexer) that one candidate set's
start reaches while two or more terminals are alive: a breadth-first walk in C
(grammar/csrc/lexer_product.c), or the Python reference below where no compiler works. It
runs when a parser stack first meets a candidate set, inside a mask fill, so it is kept in C:
in numpy (~70 µs a state) it was most of a first fill's time.

The walk reads the lexer's table, which holds every terminal's own states (the states where only
that terminal is alive), and returns its states as lists of those ids."""
from dataclasses import dataclass

import numpy as np

from gdserve.grammar.token_index import mask_library

DEAD = -1


@dataclass(frozen=True)
class Product:
    """The n states a walk added: state i (lexer id first_id + i) is members[ptr[i]:ptr[i+1]]
    (own-state ids, ascending); 0 is the start."""
    ptr: np.ndarray       # int32 [n + 1]
    members: np.ndarray   # int32 [ptr[n]]
    rows: np.ndarray      # int64 [n, C]: the next lexer id, DEAD where the lexeme dies
    best: np.ndarray      # int32 [n]: the completed terminal that is emitted (by rank), -1 if none
    n_final: np.ndarray   # int32 [n]: how many members complete a terminal


class ProductWalk:
    """The walks of one lexer (n_classes byte classes): the product states it knows, with their
    lexer ids, so a walk adds only new ones (a candidate set one key short of the last one
    shares all but a few), and buffers kept from walk to walk (the arrays a walk returns are
    those buffers: read them before the next). Pickles without the buffers."""

    def __init__(self, n_classes: int) -> None:
        self.n_classes = n_classes
        self.known: dict[tuple[int, ...], int] = {}  # the reference's known states
        self.k_table = np.full(1024, -1, dtype=np.int32)
        self.k_off, self.k_len, self.k_id = (np.empty(512, dtype=np.int64), np.empty(512, dtype=np.int32),
                                             np.empty(512, dtype=np.int32))
        self.k_members, self.k_count = np.empty(2048, dtype=np.int32), np.zeros(2, dtype=np.int64)
        self._attach()

    def __getstate__(self) -> dict:
        return {k: self.__dict__[k] for k in ("n_classes", "known", "k_table", "k_off", "k_len", "k_id",
                                               "k_members", "k_count")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach()

    def _attach(self) -> None:
        """This process's library and the walk's buffers (neither pickled)."""
        self.lib = mask_library()
        self._grow(256, 1024)

    def run(self, start: np.ndarray, trans: np.ndarray, dead: int, accept: np.ndarray, rank: np.ndarray,
            first_id: int) -> Product:
        """From `start` (int32 own-state ids, ascending); the new states get lexer ids from
        first_id on. trans: int32 [states, n_classes], `dead` where the lexeme dies; accept:
        int32 per state, the terminal it completes (-1 none); rank: int64 per terminal, the
        order that picks the emitted one among those completed."""
        if self.lib is None:
            return _product_reference(start, trans, dead, accept, rank, first_id, self.known)
        k = len(start)
        if len(self.members) < k:
            self._grow(len(self.best), 4 * k)
        while True:
            n = self.lib.lexer_product(k, start.ctypes.data, trans.ctypes.data, self.n_classes, dead,
                                       accept.ctypes.data, rank.ctypes.data, first_id, len(self.best),
                                       len(self.members), *self._out, *self._known_args())
            if n >= 0:
                return Product(self.ptr[:n + 1], self.members[:int(self.ptr[n])], self.rows[:n], self.best[:n],
                               self.n_final[:n])
            if n == -1:
                self._grow(4 * len(self.best), len(self.members))
            elif n == -2:
                self._grow(len(self.best), 4 * len(self.members))
            else:
                self._grow_known()

    def _known_args(self) -> tuple:
        return (self.k_table.ctypes.data, len(self.k_table) - 1, self.k_off.ctypes.data, self.k_len.ctypes.data,
                self.k_id.ctypes.data, self.k_members.ctypes.data, self.k_count.ctypes.data, len(self.k_id),
                len(self.k_members))

    def _grow_known(self) -> None:
        """Room for four times the known states and their members (rehashed)."""
        entries, used = (int(x) for x in self.k_count)
        self.k_off, self.k_len, self.k_id = (np.resize(a, 4 * len(a)) for a in (self.k_off, self.k_len, self.k_id))
        self.k_members = np.resize(self.k_members, 4 * len(self.k_members))
        self.k_table = np.empty(4 * len(self.k_table), dtype=np.int32)
        self.lib.lexer_product_rehash(self.k_table.ctypes.data, len(self.k_table) - 1, self.k_off.ctypes.data,
                                      self.k_len.ctypes.data, self.k_members.ctypes.data, entries)

    def _grow(self, states: int, members: int) -> None:
        self.ptr, self.members = np.empty(states + 1, dtype=np.int32), np.empty(members, dtype=np.int32)
        self.rows = np.empty((states, self.n_classes), dtype=np.int64)
        self.best, self.n_final = np.empty(states, dtype=np.int32), np.empty(states, dtype=np.int32)
        self.table = np.empty(1 << (2 * states - 1).bit_length(), dtype=np.int32)
        self.next = np.empty(members, dtype=np.int32)
        self._out = [a.ctypes.data for a in (self.ptr, self.members, self.rows, self.best, self.n_final, self.table)]
        self._out += [len(self.table) - 1, self.next.ctypes.data]


def _product_reference(start, trans, dead, accept, rank, first_id, known) -> Product:
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
            elif nxt in known:
                row.append(known[nxt])
            else:
                if nxt not in index:
                    index[nxt] = len(states)
                    states.append(nxt)
                row.append(first_id + index[nxt])
        rows.append(row)
    known.update((members, first_id + i) for i, members in enumerate(states) if i)
    return Product(np.cumsum([0] + [len(m) for m in states]).astype(np.int32),
                   np.array([s for m in states for s in m], dtype=np.int32),
                   np.array(rows, dtype=np.int64).reshape(len(states), trans.shape[1]),
                   np.array(best, dtype=np.int32), np.array(n_final, dtype=np.int32))

