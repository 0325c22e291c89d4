"""The contextual lexer of a CfgSpec: one byte DFA per terminal (outlines-core, as token_index, or
composed from its parts' by dfa_ops where it holds a long bounded repetition), and
one product DFA over them that reads one lexeme, started per candidate set (the terminals the
parser can take next, plus the ignored ones).

Lexing semantics (what the matcher enforces, and how it differs from lark). A spec with
`exact` (JSON Schema grammars, whose terminals are the writer's own cuts of one regex) lets a
lexeme end at any complete match of any candidate, ties included, so the language is every
concatenation of terminals that parses: the matcher follows each way (cfg.grammar.CfgGrammar.advance).
Otherwise (Lark and GBNF grammars, which their users lex with lark):
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
import re
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

import numpy as np

from gdserve.grammar.cfg.complete import shortest_spelling, spelling_by_distance
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.keys import expand_keys, key_dfa, placeholder_names
from gdserve.grammar.cfg.lexer_product import Product, ProductWalk
from gdserve.grammar.cfg.lark_spec import CfgSpec, Terminal
from gdserve.grammar.regex.syntax import explain_index_error
from gdserve.grammar.regex.dfa_ops import concat, joint_classes, repeat
from gdserve.grammar.regex.tree import (LONG_REPEAT_COPIES, LONG_REPEAT_SIZE, SUB_OPEN, Alt, Atom, Node, Repeat,
                                       Seq, alternates_at_top, parse, to_regex)
from gdserve.grammar.token_index import ByteDFA, build_byte_dfa, byte_classes, indexed_pattern, mask_library, start_state


def terminal_dfa(t: Terminal) -> ByteDFA:
    try:
        dfa = _regex_dfa(t.regex)
    except ValueError as e:
        raise GrammarError(f"terminal {t.name}: {explain_index_error(expand_keys(t.regex), e)}") from None
    if dfa.final[dfa.start]:
        raise GrammarError(f"terminal {t.name} matches the empty string")
    return dfa


@lru_cache(maxsize=4096)
def _regex_dfa(regex: str) -> ByteDFA:
    """The terminal's DFA, started after the sentinel of indexed_pattern. Grammars share most
    terminals (strings, numbers, punctuation with whitespace): a compile worker builds each DFA
    once. A terminal that starts with literal bytes (a JSON key: `"name"` then whitespace, `:` and
    the value) is those bytes but the last as a chain of states before the DFA of the rest (`"`,
    whitespace, `:`, the value), which keys with values alike share. One with a long bounded
    repetition is composed from its parts' DFAs (_composed). The arrays are never written."""
    prefix, rest = _literal_prefix(regex)
    if prefix:
        return _chained(prefix, _regex_dfa(rest))
    if SUB_OPEN in regex:
        return _with_keys(regex)
    composed = _composed(regex)
    if composed is not None:
        return composed
    dfa = build_byte_dfa(indexed_pattern(f"{_MARK}(?:{regex})"))
    return replace(dfa, start=dfa.walk(start_state(dfa), _MARK_BYTES))


# A byte read before the regex: outlines-core takes time exponential in the bound on a regex that
# starts with a bounded repetition whose first characters include the character before it (a JSON
# string character after indexed_pattern's noncharacter sentinel: 16 copies 8 s), milliseconds
# where they exclude it. A raw control character starts no JSON text (strings escape them).
_MARK, _MARK_BYTES = "\\x01", b"\x01"


_BOUNDS = re.compile(r"(\)?)\{(\d*),(\d+)\}")  # a bounded quantifier, after a group or not


def _composed(regex: str) -> ByteDFA | None:
    """The DFA of a regex whose sequence holds a long bounded repetition (a string's
    maxLength), put together from its parts' DFAs (dfa_ops): outlines-core takes ~20 µs a
    state, and time exponential in the bound where the repetition comes first. None where the
    regex has no such repetition, is not in the generated dialect, has anchors or lookarounds
    (which a cut would cut off from their context), or a seam is not deterministic."""
    if not any(int(hi) - int(lo or 0) >= LONG_REPEAT_COPIES and (group or int(hi) >= LONG_REPEAT_SIZE)
               for group, lo, hi in _BOUNDS.findall(regex)):
        return None  # no long repetition (whitespace's `[ \t]{0,24}` is not): not parsed
    try:
        node = parse(regex)
    except GrammarError:
        return None
    if not _long_repeat_on_spine(node) or not _context_free(node):
        return None
    return _compose(node)


def _with_keys(regex: str) -> ByteDFA:
    """The DFA of a regex holding json.keys placeholders: where they are items of its top
    sequence, the parts between them and the keys' own DFAs concatenated; otherwise (or where a
    key's DFA or a seam is not available) the regex with the keys written out."""
    node = parse(regex)
    dfa = None
    for part in _cut(node.items if isinstance(node, Seq) else (node,), _is_key):
        if _is_key(part):
            d = key_dfa(placeholder_names(part.text))
        else:
            text = to_regex(part)
            d = None if SUB_OPEN in text else _regex_dfa(text)
        dfa = d if dfa is None or d is None else concat(dfa, d)
        if d is None or dfa is None:
            return _regex_dfa(expand_keys(regex))
    return dfa


def _is_key(node: Node) -> bool:
    return isinstance(node, Atom) and node.text.startswith(SUB_OPEN)


def _cut(items: tuple, apart) -> list[Node]:
    """A sequence's items: each one `apart` alone, the runs between them as one node each."""
    parts, run = [], []
    for item in items:
        if apart(item):
            parts += [Seq(tuple(run))] if len(run) > 1 else run
            parts.append(item)
            run = []
        else:
            run.append(item)
    return parts + ([Seq(tuple(run))] if len(run) > 1 else run)


def _composable(node: Node) -> bool:
    """A repetition the prefilter lets through: LONG_REPEAT_COPIES optional copies or more, of a
    group (which outlines-core is slowest on) or LONG_REPEAT_SIZE of an atom."""
    return (isinstance(node, Repeat) and node.hi is not None and node.hi - node.lo >= LONG_REPEAT_COPIES
            and (not isinstance(node.item, Atom) or node.hi >= LONG_REPEAT_SIZE))


def _long_repeat_on_spine(node: Node) -> bool:
    return _composable(node) or isinstance(node, Seq) and any(map(_long_repeat_on_spine, node.items))


def _context_free(node: Node) -> bool:
    if isinstance(node, Atom):
        return not (node.text in ("^", "$") or node.text.startswith("(?") or node.text in _ASSERTIONS)
    children = node.items if isinstance(node, Seq) else node.options if isinstance(node, Alt) else [node.item]
    return all(map(_context_free, children))


_ASSERTIONS = ("\\b", "\\B", "\\A", "\\z", "\\Z")


def _compose(node: Node) -> ByteDFA | None:
    if _composable(node):
        item = _part(node.item)
        return None if item is None else repeat(item, node.lo, node.hi)
    dfa = None
    for part in _cut(node.items, _long_repeat_on_spine):
        d = _part(part)
        if d is None:
            return None
        dfa = d if dfa is None else concat(dfa, d)
        if dfa is None:
            return None
    return dfa


def _part(node: Node) -> ByteDFA | None:
    return _compose(node) if _long_repeat_on_spine(node) else _regex_dfa(to_regex(node))


_LITERAL_UNIT = r"[^\\\[\](){}|?*+.^$\ue002\ue003]|\\x[0-9a-fA-F]{2}|\\[^0-9A-Za-z]"
_LITERAL_RUN = re.compile(f"(?:{_LITERAL_UNIT})+")
_UNITS = re.compile(_LITERAL_UNIT)


def _literal_prefix(regex: str) -> tuple[bytes, str]:
    """(the bytes every match starts with, spelled by the regex's leading plain characters but the
    last of them, the rest of the regex): (b"", regex) where the regex does not start so. The
    rest keeps one literal character in front: outlines-core takes time exponential in the bound
    on a pattern that starts with a bounded repetition (a string of 3-256 characters: minutes),
    and milliseconds where a character comes first."""
    run = _LITERAL_RUN.match(regex)
    if run is None:
        return b"", regex
    units = _UNITS.findall(run.group())
    if regex[run.end():run.end() + 1] in ("?", "*", "+", "{"):
        units.pop()  # the quantifier's operand
    if len(units) < 2 or alternates_at_top(regex):
        return b"", regex
    return "".join(map(_unit_char, units[:-1])).encode(), regex[sum(map(len, units[:-1])):]


def _unit_char(unit: str) -> str:
    """The character a _LITERAL_UNIT stands for."""
    if len(unit) == 1:
        return unit
    return chr(int(unit[2:], 16)) if unit.startswith("\\x") else unit[1]


def _chained(prefix: bytes, rest: ByteDFA) -> ByteDFA:
    """The DFA of prefix's bytes, then rest's language: one state per byte of the prefix before
    rest's states (its dead state stays the last), each prefix byte a byte class of its own."""
    n = len(prefix)
    own = np.full(256, 256, dtype=np.int64)
    own[list(prefix)] = list(prefix)
    classes, (old_class, _) = joint_classes([rest.classes, own])  # old_class: each one's class in rest
    dead = n + rest.dead
    trans = np.full((dead + 1, len(old_class)), dead, dtype=np.int32)
    trans[n:] = rest.trans[:, old_class] + n
    for i, b in enumerate(prefix):
        trans[i, classes[b]] = i + 1 if i + 1 < n else rest.start + n
    final = np.concatenate([np.zeros(n, dtype=bool), rest.final])
    return ByteDFA(classes, trans, final, 0, tail=(rest, n))


def _preference(spec: CfgSpec, tid: int) -> tuple:
    t = spec.terminals[tid]
    return (-t.priority, not t.literal, tid)


@dataclass(eq=False)
class Lexer:
    """One product DFA over all terminals, grown on demand: a state is the set of terminals still
    alive with their DFA states, so every candidate set's lexer shares the states after its
    first byte (and their stored masks). Each candidate set has its own start state, added with
    every state it reaches where two or more terminals are alive at once (lexer_product); the
    states where only one terminal is alive are that terminal's DFA: every terminal's are added
    when the lexer is first used."""
    spec: CfgSpec
    dfas: list[ByteDFA]
    num_states: int = 0
    # The states in the token walks' form (token_index.ByteDFA): room for more, the last row the
    # dead state (every entry that dies points there), so the walks read them as they grow.
    _table: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int32))
    _accept: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    _final: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    _starts: dict[tuple[int, ...], int] = field(default_factory=dict)
    _ties: dict[tuple[int, ...], int] = field(default_factory=dict)  # exact: a tie's accept id
    _tie_terms: list[tuple[int, ...]] = field(default_factory=list)  # accept id - K -> its tie
    _snapshot: tuple[ByteDFA, np.ndarray] | None = None
    _live: dict[int, bool] = field(default_factory=dict)
    _ends: dict[int, bytes | None] = field(default_factory=dict)  # see shortest_end

    def __getstate__(self) -> dict:
        """Its tables cut to the states in use (they grow by doubling: half the rows may be room)
        with the dead state right after them, and without the walks' views (arrays() makes them)."""
        state = dict(self.__dict__)
        n, dead = self.num_states, self._dead
        if len(self._table) > n + 1:
            table = np.full((n + 1, self._table.shape[1]), n, dtype=np.int32)
            used = self._table[:n]
            table[:n] = np.where(used == dead, n, used)
            accept = np.full(n + 1, -1, dtype=np.int32)
            accept[:n] = self._accept[:n]
            state.update(_table=table, _accept=accept, _final=accept >= 0)
        state["_snapshot"] = None
        return state

    @cached_property
    def _joint(self) -> tuple[np.ndarray, np.ndarray]:
        """(int [K, C] each terminal's byte class per joint class, uint8 [256] joint class)."""
        joint, classes = byte_classes(np.stack([d.classes for d in self.dfas]))  # bytes as columns
        return joint.astype(np.int64), classes

    @cached_property
    def _byte_class(self) -> list[int]:
        return self._joint[1].tolist()

    @cached_property
    def _rank(self) -> np.ndarray:
        """Each terminal's place in the order that picks the emitted one among complete ones."""
        order = sorted(range(len(self.dfas)), key=lambda t: _preference(self.spec, t))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        return rank

    @cached_property
    def _start_states(self) -> set[int]:
        return set()

    @cached_property
    def _bases(self) -> np.ndarray:
        """int64 [K]: the first id of each terminal's own states (where only it is still alive:
        its DFA), all added when the lexer is first used."""
        sizes = np.array([len(d.final) for d in self.dfas], dtype=np.int64)
        bases = self._new_states(int(sizes.sum())) + np.cumsum(sizes) - sizes
        for t, dfa in enumerate(self.dfas):
            self._add_own_rows(t, dfa, int(bases[t]))
        return bases

    def _add_own_rows(self, t: int, dfa: ByteDFA, base: int) -> None:
        """Terminal t's DFA as the lexer's states from `base` on (a lazy terminal ends at its
        first match)."""
        lazy, joint = self.spec.terminals[t].lazy, self._joint[0][t]
        lib = mask_library()
        if lib is None:
            nxt = dfa.trans[:, joint]
            rows = np.where((nxt == dfa.dead) | (dfa.final & lazy)[:, None], -1, nxt + base)
            self._set(base, rows, np.where(dfa.final, t, -1))
            return
        trans = np.ascontiguousarray(dfa.trans, dtype=np.int32)
        final = np.ascontiguousarray(dfa.final, dtype=np.uint8)
        joint = np.ascontiguousarray(joint, dtype=np.int64)
        lib.lexer_own_rows(trans.ctypes.data, trans.shape[0], trans.shape[1], final.ctypes.data, dfa.dead, lazy,
                           joint.ctypes.data, len(joint), base, self._dead, t, self._table[base].ctypes.data,
                           self._accept[base:].ctypes.data, self._final[base:].ctypes.data)

    @cached_property
    def _own_starts(self) -> np.ndarray:
        """int32 [K]: each terminal's start among its own states."""
        return (self._bases + np.array([d.start for d in self.dfas], dtype=np.int64)).astype(np.int32)

    @cached_property
    def _walk(self) -> ProductWalk:
        return ProductWalk(self._joint[0].shape[1])

    def start(self, candidates: frozenset[int]) -> int:
        terms = tuple(sorted(candidates))
        sid = self._starts.get(terms)
        if sid is None:
            sid = self._starts[terms] = self._add_product(terms)
            self._start_states.add(sid)
        return sid

    @cached_property
    def _own_end(self) -> int:
        return int(self._bases[-1]) + len(self.dfas[-1].final) if self.dfas else 0

    def shortest_end(self, state: int) -> bytes | None:
        """The shortest bytes that complete the lexeme of `state` (printable bytes preferred),
        None if none can: read off the terminal's DFA where one terminal is alive, else searched
        in the product; cached (a state's transitions never change as the lexer grows)."""
        if state not in self._ends:
            own = self._own(state)
            self._ends[state] = (spelling_by_distance(self.dfas[own[0]], own[1]) if own else
                                 shortest_spelling(self.arrays()[0], state))
        return self._ends[state]

    def _own(self, state: int) -> tuple[int, int] | None:
        """(the terminal, its DFA's state) of a state where one terminal is alive, or None."""
        if state >= self._own_end:
            return None
        t = int(np.searchsorted(self._bases, state, side="right")) - 1
        return t, state - int(self._bases[t])

    def shared_key(self, state: int) -> tuple[tuple[int, int], int] | None:
        """((a DFA, its state): the state's family, the terminal) of a state where one terminal is
        alive, or None. A family's states read every byte string alike but for the terminal they
        complete: one DFA's state, in every terminal that ends in that DFA (ByteDFA.tail: keys
        with values alike)."""
        own = self._own(state)
        if own is None:
            return None
        t, i = own
        dfa = self.dfas[t]
        while dfa.tail is not None and i >= dfa.tail[1]:
            dfa, i = dfa.tail[0], i - dfa.tail[1]
        return (id(dfa), i), t

    def _add_product(self, terms: tuple[int, ...]) -> int:
        """Adds the start of `terms` and the states it reaches where two or more of them are
        alive that are not known yet (a later candidate set shares them); returns the start's id."""
        start = self._own_starts[list(terms)]  # first: adds every terminal's own states
        first = self.num_states
        p = self._walk.run(start, self._table, self._dead, self._accept, self._rank, first)
        self._new_states(len(p.best))
        self._set(first, p.rows, self._accepts(p))
        return first

    def _accepts(self, p: Product) -> np.ndarray:
        """The accept ids of product states: the preferred completed terminal, or (exact) the tie."""
        accept = p.best.copy()
        if self.spec.exact:
            for i in np.flatnonzero(p.n_final > 1).tolist():
                done = self._accept[p.members[p.ptr[i]:p.ptr[i + 1]]]
                accept[i] = self._tie_id(tuple(done[done >= 0].tolist()))
        return accept

    def _new_states(self, n: int) -> int:
        first, self.num_states = self.num_states, self.num_states + n
        if self.num_states >= len(self._table):
            cap = max(self.num_states + 1, 2 * len(self._table), 64)
            table = np.full((cap, self._joint[0].shape[1]), cap - 1, dtype=np.int32)
            accept = np.full(cap, -1, dtype=np.int32)
            if first:
                old = self._table[:first]
                table[:first] = np.where(old == self._dead, cap - 1, old)
                accept[:first] = self._accept[:first]
            self._table, self._accept, self._final = table, accept, accept >= 0
            self._snapshot = None
        return first

    @property
    def _dead(self) -> int:
        return len(self._table) - 1

    def _set(self, first: int, rows: np.ndarray, accept: np.ndarray) -> None:
        """Rows (next state ids, -1 where the lexeme dies) and accepted terminals of states."""
        self._table[first:first + len(rows)] = np.where(rows >= 0, rows, self._dead)
        self._accept[first:first + len(rows)] = accept
        self._final[first:first + len(rows)] = accept >= 0

    def _tie_id(self, terms: tuple[int, ...]) -> int:
        tid = self._ties.get(terms)
        if tid is None:
            tid = self._ties[terms] = len(self.dfas) + len(self._tie_terms)
            self._tie_terms.append(terms)
        return tid

    def emitted(self, accept_id: int) -> tuple[int, ...]:
        """The terminals an accept id stands for: none (-1), one, or (exact) a tie (ids >= K)."""
        if accept_id < len(self.dfas):
            return () if accept_id < 0 else (accept_id,)
        return self._tie_terms[accept_id - len(self.dfas)]

    def emits(self, state: int) -> tuple[int, ...]:
        """The terminals a lexeme ending in `state` may be emitted as."""
        return self.emitted(self._accept.item(state))

    def arrays(self) -> tuple[ByteDFA, np.ndarray]:
        """The states as a ByteDFA (dead = the last state) and int32 accept per state, for the
        token-trie walks: views that follow the DFA as it grows (new when it moves to more room)."""
        if self._snapshot is None:
            self._snapshot = (ByteDFA(self._joint[1], self._table, self._final, -1), self._accept)
        return self._snapshot

    def is_start(self, state: int) -> bool:
        return state in self._start_states

    def live(self, state: int) -> bool:
        """Whether some byte keeps the lexeme alive (cached: a state's row never changes)."""
        alive = self._live.get(state)
        if alive is None:
            alive = self._live[state] = bool((self._table[state] != self._dead).any())
        return alive

    def live_bytes(self, state: int) -> np.ndarray:
        """bool [256]: the bytes after which the lexeme in `state` is still alive."""
        row = self._table[state] != self._dead
        return row[self._joint[1]]

    def step(self, state: int, byte: int) -> int:
        """The next state, -1 if the lexeme dies."""
        nxt = self._table.item(state, self._byte_class[byte])
        return -1 if nxt == len(self._table) - 1 else nxt

