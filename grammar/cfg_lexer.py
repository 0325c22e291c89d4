"""The contextual lexer of a CfgSpec: one byte DFA per terminal (outlines-core, as token_index), and
one product DFA over them that reads one lexeme, started per candidate set (the terminals the
parser can take next, plus the ignored ones).

Lexing semantics (what the matcher enforces, and how it differs from lark):
- maximal munch without backtracking: a lexeme goes on while some candidate terminal can still
  extend it; at the first byte that none can take, the bytes so far must match a candidate in
  full, and that terminal is emitted. (lark's `re.match` over an alternation ordered by priority
  and width mostly agrees; it backtracks where a long candidate fails, which we reject.)
- a lazy terminal (lazy quantifier) ends at its first match.
- among candidates that match the same lexeme: higher priority, then a string literal over a
  pattern (lark's `unless` keyword handling), then the terminal listed first by lark.
- candidates are the terminals the parser can take at that point, checked by running the parse
  table (lark's contextual lexer takes the state's action keys; they differ only where LALR
  merging makes a reduce lead to an error, and there lark fails anyway).
The product DFA's start state has no way back in, so "at start" means "empty lexeme".
"""
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.lark_spec import CfgSpec, Terminal
from gdserve.grammar.regex import explain_index_error
from gdserve.grammar.token_index import ByteDFA, build_byte_dfa


def terminal_dfa(t: Terminal) -> ByteDFA:
    try:
        dfa = _regex_dfa(t.regex)
    except ValueError as e:
        raise GrammarError(f"terminal {t.name}: {explain_index_error(t.regex, e)}") from None
    if dfa.final[dfa.start]:
        raise GrammarError(f"terminal {t.name} matches the empty string")
    return dfa


@lru_cache(maxsize=4096)
def _regex_dfa(regex: str) -> ByteDFA:
    """Grammars share most terminals (strings, numbers, punctuation with whitespace): a compile
    worker builds each DFA once (~20 ms apiece). The arrays are never written."""
    return build_byte_dfa(f"(?:{regex})\\z")


_COLUMN_WEIGHTS = np.random.default_rng(1).integers(1, 2**63, size=4096, dtype=np.uint64) | np.uint64(1)


def _distinct_columns(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first column of each distinct kind, each column's kind) of a small int matrix."""
    if len(a) <= len(_COLUMN_WEIGHTS):
        hashes = ((a + 1).astype(np.uint64) * _COLUMN_WEIGHTS[:len(a), None]).sum(axis=0, dtype=np.uint64)
        kinds: dict[int, int] = {}
        inverse = np.array([kinds.setdefault(h, len(kinds)) for h in hashes.tolist()])
        first = np.zeros(len(kinds), dtype=np.int64)
        first[inverse[::-1]] = np.arange(len(inverse))[::-1]
        if (a[:, first[inverse]] == a).all():
            return first, inverse
    _, first, inverse = np.unique(a, axis=1, return_index=True, return_inverse=True)  # exact
    return first, inverse.reshape(-1)


def _preference(spec: CfgSpec, tid: int) -> tuple:
    t = spec.terminals[tid]
    return (-t.priority, not t.literal, tid)


Key = tuple  # ("start", candidates) or ("in", ((terminal id, its DFA state), ...)) of live ones


@dataclass(eq=False)
class Lexer:
    """One product DFA over all terminals, grown on demand: a state is the set of terminals still
    alive with their DFA states, so every candidate set's lexer shares the states after its
    first byte (and their stored masks). Each candidate set has its own start state."""
    spec: CfgSpec
    dfas: list[ByteDFA]
    keys: list[Key] = field(default_factory=list)
    rows: list[list[int]] = field(default_factory=list)   # next state per joint class, -1 = dead
    accept: list[int] = field(default_factory=list)       # the emitted terminal id, or -1
    _ids: dict[Key, int] = field(default_factory=dict)
    _snapshot: tuple[ByteDFA, np.ndarray] | None = None

    @cached_property
    def _joint(self) -> tuple[np.ndarray, np.ndarray]:
        """(int [K, C] each terminal's byte class per joint class, uint8 [256] joint class)."""
        joint, classes = np.unique(np.stack([d.classes for d in self.dfas]), axis=1,
                                   return_inverse=True)
        return joint, classes.reshape(256).astype(np.uint8)

    def start(self, candidates: frozenset[int]) -> int:
        key = ("start", tuple(sorted(candidates)))
        if key not in self._ids:
            self._add(key)
        return self._ids[key]

    def _add(self, key: Key) -> None:
        todo = [key]
        self._ids[key] = len(self.keys)
        self.keys.append(key)
        while todo:
            k = todo.pop()
            successors, inverse = self._successors(k)
            ids = [self._id_of(nxt, todo) for nxt in successors]
            self._set_rows(self._ids[k], [[ids[i] for i in inverse]], [self._accepted(k)])
        self._snapshot = None

    def _id_of(self, key: Key | None, todo: list[Key]) -> int:
        if key is None:
            return -1
        if len(key[1]) == 1:
            t, s = key[1][0]
            return self._single(t) + s
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self.keys)
            self.keys.append(key)
            todo.append(key)
        return sid

    def _single(self, t: int) -> int:
        """The first id of terminal t's own states (the lexeme only t can still read): added
        all at once, one per state of its DFA, since they are most of a big grammar's states."""
        base = self._single_base.get(t)
        if base is None:
            dfa = self.dfas[t]
            base = self._single_base[t] = len(self.keys)
            self.keys.extend(("in", ((t, s),)) for s in range(len(dfa.final)))
            rows = np.where(self._trans(t) >= 0, self._trans(t) + base, -1)
            if self.spec.terminals[t].lazy:
                rows[dfa.final] = -1
            self._set_rows(base, rows.tolist(), np.where(dfa.final, t, -1).tolist())
        return base

    @cached_property
    def _single_base(self) -> dict[int, int]:
        return {}

    def _accepted(self, key: Key) -> int:
        if key[0] != "in":
            return -1
        done = [t for t, s in key[1] if self.dfas[t].final[s]]
        return min(done, key=lambda t: _preference(self.spec, t)) if done else -1

    def _set_rows(self, first: int, rows: list[list[int]], accept: list[int]) -> None:
        end = first + len(rows)
        if len(self.rows) < end:
            self.rows.extend([] for _ in range(end - len(self.rows)))
            self.accept.extend(-1 for _ in range(end - len(self.accept)))
        self.rows[first:end] = rows
        self.accept[first:end] = accept

    @cached_property
    def _joint_trans(self) -> dict[int, np.ndarray]:
        """terminal id -> int32 [its states, joint classes]: next state, -1 where dead."""
        return {}

    def _trans(self, t: int) -> np.ndarray:
        table = self._joint_trans.get(t)
        if table is None:
            dfa = self.dfas[t]
            table = dfa.trans[:, self._joint[0][t]]
            table = self._joint_trans[t] = np.where(table == dfa.dead, -1, table).astype(np.int32)
        return table

    def _successors(self, key: Key) -> tuple[list[Key | None], np.ndarray]:
        """The distinct next keys and, per joint class, which of them it leads to."""
        if key[0] == "start":
            parts = [(t, self.dfas[t].start) for t in key[1]]
        else:
            parts = [(t, s) for t, s in key[1]
                     if not (self.spec.terminals[t].lazy and self.dfas[t].final[s])]
        num_classes = self._joint[0].shape[1]
        if not parts:
            return [None], [0] * num_classes
        terms = np.array([t for t, _ in parts])
        nexts = np.stack([self._trans(t)[s] for t, s in parts])       # [parts, classes]
        firsts, inverse = _distinct_columns(nexts)
        successors = []
        for c in firsts.tolist():
            col = nexts[:, c]
            alive = col >= 0
            successors.append(("in", tuple(zip(terms[alive].tolist(), col[alive].tolist())))
                              if alive.any() else None)
        return successors, inverse.tolist()

    def arrays(self) -> tuple[ByteDFA, np.ndarray]:
        """The states so far as a ByteDFA (dead = the last state) and int32 accept per state, for
        the token-trie walks; rebuilt after the DFA grows."""
        if self._snapshot is None:
            dead = len(self.keys)
            trans = np.array(self.rows + [[-1] * len(self.rows[0])], dtype=np.int32)
            trans[trans < 0] = dead
            accept = np.array(self.accept + [-1], dtype=np.int32)
            self._snapshot = (ByteDFA(self._joint[1], np.ascontiguousarray(trans), accept >= 0, -1),
                              accept)
        return self._snapshot

    def is_start(self, state: int) -> bool:
        return self.keys[state][0] == "start"

    def live(self, state: int) -> bool:
        return any(n >= 0 for n in self.rows[state])

    def step(self, state: int, byte: int) -> int:
        """The next state, -1 if the lexeme dies."""
        return self.rows[state][self._joint[1][byte]]
