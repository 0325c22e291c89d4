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
            row = []
            for nxt in self._successors(k):
                if nxt is None:
                    row.append(-1)
                    continue
                if nxt not in self._ids:
                    self._ids[nxt] = len(self.keys)
                    self.keys.append(nxt)
                    todo.append(nxt)
                row.append(self._ids[nxt])
            self._set_row(self._ids[k], row, k)
        self._snapshot = None

    def _set_row(self, sid: int, row: list[int], key: Key) -> None:
        while len(self.rows) <= sid:
            self.rows.append([])
            self.accept.append(-1)
        self.rows[sid] = row
        if key[0] == "in":
            done = [t for t, s in key[1] if self.dfas[t].final[s]]
            self.accept[sid] = min(done, key=lambda t: _preference(self.spec, t)) if done else -1

    def _successors(self, key: Key) -> list[Key | None]:
        joint, _ = self._joint
        if key[0] == "start":
            parts = [(t, self.dfas[t].start) for t in key[1]]
        else:
            parts = [(t, s) for t, s in key[1]
                     if not (self.spec.terminals[t].lazy and self.dfas[t].final[s])]
        nexts = [(t, self.dfas[t].trans[s, joint[t]].tolist(), self.dfas[t].dead) for t, s in parts]
        out = []
        for c in range(joint.shape[1]):
            alive = tuple((t, n[c]) for t, n, dead in nexts if n[c] != dead)
            out.append(("in", alive) if alive else None)
        return out

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
