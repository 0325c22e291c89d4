"""A regex's byte DFA determinized on demand: ByteDFA's interface over the states of regex.nfa's
subset construction (grammar/csrc/byte_dfa.c) built as matchers reach them.

A JSON schema's DFA has thousands of states, most of which no sequence visits; a token walk
from a state reads at most the trie's depth in bytes, so the index asks for every state within
that many bytes of a state before walking from it (`prepare`), and a matcher's step expands the
states its token's bytes pass through (`walk`). Each state's distance to completion is known as
soon as it exists (its NFA nodes' least), so budgets need no sweep of the whole DFA. State 0 is
the dead state, 1 the start; ids never change once given, so rows and masks cached by state stay
valid as the DFA grows. Pickles as its NFA and the order its states were expanded in, which the
copy replays (the subset construction numbers states in the order it finds them).
"""
from __future__ import annotations

import numpy as np

from gdserve.grammar.regex.nfa import ByteNFA, Unsupported, build_nfa
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.token_index import builder_arrays, mask_library, new_builder


class LazyByteDFA:
    """ByteDFA's fields (classes, trans, final, distance, start, dead) over the states built so
    far; a state's row holds 0s (dead) until it is expanded."""
    start = 1
    dead = 0
    complete = False  # the table holds only the states built so far (see ByteDFA.complete)
    generation = 0    # counts the times states were added
    moves = 0         # counts the times the builder's arrays moved (they grew)

    def __init__(self, nfa: ByteNFA, order: tuple[int, ...] = ()):
        self.nfa = nfa
        self.classes = np.ascontiguousarray(nfa.class_of, dtype=np.uint8)
        self._class_ptr = self.classes.ctypes.data
        self._lib = mask_library()
        self._handle = new_builder(self._lib, nfa)
        if not self._handle:
            raise MemoryError("out of memory for a regex's DFA")
        self._views: tuple[np.ndarray, ...] | None = None  # over the capacity, not only the states
        self._count = self._capacity = 0
        for state in order:
            self._check(self._lib.byte_dfa_expand(self._handle, state))
        self._expanded()
        self.max_distance = int(self._lib.byte_dfa_max_distance(self._handle))

    def __del__(self):
        if getattr(self, "_handle", None):
            self._lib.byte_dfa_free(self._handle)
            self._handle = None

    def __reduce__(self):
        order = builder_arrays(self._lib, self._handle, self.nfa.num_classes, self._count)[4]
        return LazyByteDFA, (self.nfa, tuple(order.tolist()))

    @property
    def trans(self) -> np.ndarray:
        return self._arrays()[0][:self._count]

    @property
    def final(self) -> np.ndarray:
        return self._arrays()[1][:self._count]

    @property
    def distance(self) -> np.ndarray:
        return self._arrays()[2][:self._count]

    def prepare(self, state: int, depth: int) -> None:
        """Build every state within `depth` bytes of `state`."""
        self._check(self._lib.byte_dfa_reach(self._handle, state, depth))
        self._expanded()

    def expand_all(self) -> None:
        """Build every state (for checks that need the whole DFA)."""
        self._check(self._lib.byte_dfa_expand_all(self._handle))
        self._expanded()

    def reaches(self, state: int, ok: np.ndarray) -> bool:
        """Whether reading only bytes b with ok[b] (bool [256]) leads from `state` to an
        accepting state: depth-first over the NFA, without building states."""
        classes = np.zeros(self.nfa.num_classes, dtype=np.uint8)
        classes[self.classes[ok]] = 1
        return bool(self._lib.byte_dfa_reaches(self._handle, state, classes.ctypes.data))

    def walk(self, state: int, data: bytes) -> int:
        """The state after reading `data` from `state` (dead if it dies on the way)."""
        state = self._lib.byte_dfa_walk(self._handle, state, data, len(data), self._class_ptr)
        self._check(state)
        self._expanded()
        return state

    def _expanded(self) -> None:
        """After expansions: where states were added the generation moves on, and where the
        arrays grew (they moved) the views are read again. Rows filled in place show through
        the views as they are."""
        count = self._lib.byte_dfa_states(self._handle)
        if count != self._count:
            self._count = count
            self.generation += 1
            capacity = self._lib.byte_dfa_capacity(self._handle)
            if capacity != self._capacity:
                self._capacity, self._views = capacity, None
                self.moves += 1

    def _arrays(self) -> tuple[np.ndarray, ...]:
        """(trans, final, distance, expanded, expansion order): views of the builder's arrays
        over their capacity (states past the count hold nothing yet)."""
        if self._views is None:
            self._views = builder_arrays(self._lib, self._handle, self.nfa.num_classes, self._capacity)
        return self._views

    @staticmethod
    def _check(rc: int) -> None:
        if rc < 0:
            raise GrammarError("the regex's DFA needs too many states (or memory) to build")


def lazy_byte_dfa(pattern: str) -> LazyByteDFA | None:
    """The lazy DFA of `pattern` (indexed_pattern's form), or None where regex.nfa does not read
    its syntax or the native kernels are off (the caller builds the whole DFA)."""
    if mask_library() is None:
        return None
    try:
        return LazyByteDFA(build_nfa(pattern))
    except Unsupported:
        return None
