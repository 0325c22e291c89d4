"""A compiled context-free grammar (kind "grammar") and its matcher, with the Grammar/Matcher API.

A configuration = (LALR stack, lexer state): the parser after every emitted terminal and the
lexeme read so far in the contextual lexer of that stack's acceptable terminals. A lexeme that is
complete and cannot grow is emitted at once, so a configuration at a lexer's start is an empty
lexeme. The matcher's state is the set of configurations the text so far can be in: always one
under maximal munch and resolved conflicts; with the spec's `exact`, a lexeme that could end
where it is or go on is followed both ways (cfg.lexer) and so is each action of a parser
conflict (cfg.parser), so the set holds every split and parse of the text (at most MAX_CONFIGS,
the first by stack depth: past it a state keeps a subset, never admitting more).

A configuration's mask is the stored `inside` words of its lexer state, ORed with the crossing
tokens that the parser lets through (cfg.masks), cached per configuration (the stack is part of
the key: it is what decides which terminal may come next); a state's mask is its configurations'
union. EOS is allowed when some configuration's lexeme is empty or complete and the parser then
accepts `$END`.
"""
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from gdserve.grammar.allowance import unit_of_work
from gdserve.grammar.bounded_cache import BoundedCache
from gdserve.grammar.cfg.budget import InsideGroups, NextCompletions, inside_groups, next_completions
from gdserve.grammar.cfg.complete import (depth_first_completion, search_completion, shortest_completion,
                                          spelling_by_distance)
from gdserve.grammar.cfg.lexer import Lexer
from gdserve.grammar.cfg.masks import Expansion, MaskStore
from gdserve.grammar.cfg.parser import LalrParser, Stack
from gdserve.grammar.forced import forced_bytes
from gdserve.grammar.cfg.lark_spec import CfgSpec
from gdserve.grammar.matcher import StateWalk
from gdserve.grammar.token_index import ByteDFA, TokenTrie
from gdserve.kernels.bitmask import empty_words, set_bits

MAX_CACHED_MASKS = 8192
STEER_FROM = 128     # budgets (tokens) below which rows keep only tokens that can close in time
STEER_MARGIN = 16    # bytes (the closing window of a grammar with nothing optional)
MAX_CACHED_NEXT_COMPLETIONS = 512  # states whose tokens' completions (and rows) a grammar keeps
MAX_CACHED_INSIDE_GROUPS = 256  # lexer states whose token groups a grammar keeps (G x W words each)
MAX_CONFIGS = 256    # configurations one state keeps (an exact grammar's splits and parses)
MAX_CACHED_STEPS = 1 << 16  # (state, token) -> next state entries a grammar keeps


@dataclass(frozen=True)
class CfgState:
    """One configuration."""
    stack: Stack
    lex: int     # state of the lexer DFA (a start state: the lexeme is empty)


CfgStates = frozenset  # of CfgState: a matcher state
TERMINATED: CfgStates = frozenset()  # after EOS (no other state is empty)


@dataclass(frozen=True)
class CfgMask:
    row: torch.Tensor   # int32 [W] packed, EOS bits included
    accepting: bool
    only_eos: bool


@dataclass
class CfgGrammar:
    """Pickles without its caches (lexers and masks are rebuilt on demand; the trie is interned)."""
    kind: str
    spec: CfgSpec = field(repr=False)
    trie: TokenTrie = field(repr=False)
    terminal_dfas: list[ByteDFA] = field(repr=False)
    vocab_size: int
    eos_token_ids: frozenset[int]
    regex: str | None = None
    relaxed: list[str] = field(default_factory=list)
    # Bytes one token may add to the shortest completion: steering starts this far ahead of it.
    # Grammars whose one token can open a long structure (a recursive schema's `{`) raise it.
    steer_margin: int = STEER_MARGIN
    report: dict | None = None  # json: the enforcement report (grammar/json/report.py)

    def __getstate__(self) -> dict:
        names = ("kind", "spec", "trie", "terminal_dfas", "vocab_size", "eos_token_ids", "regex",
                 "relaxed", "steer_margin", "report", "lexer", "_roots",  # what the first mask built
                 "terminal_spellings", "_completions")  # what steering reads, first built in the compile worker
        return {n: self.__dict__[n] for n in names if n in self.__dict__}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def matcher(self) -> "CfgMatcher":
        return CfgMatcher(self)

    # ---- parser and lexer ---------------------------------------------------------------------
    @cached_property
    def parser(self) -> LalrParser:
        return LalrParser(self.spec)

    @cached_property
    def lexer(self) -> Lexer:
        return Lexer(self.spec, self.terminal_dfas)

    @cached_property
    def _starts(self) -> BoundedCache[Stack, int]:
        return BoundedCache(MAX_CACHED_MASKS)

    def start_of(self, stack: Stack) -> int:
        """The lexer's start state for the terminals this stack can take (and the ignored)."""
        start = self._starts.get(stack)
        if start is None:
            candidates = self.parser.acceptable(stack) | self.spec.ignore
            start = self._starts.put(stack, self.lexer.start(candidates))
        return start

    def step(self, stack: Stack, terminal: int) -> tuple[Stack, ...]:
        """The stacks after an emitted terminal (ignored ones leave it as it is); none: refused."""
        if terminal in self.spec.ignore:
            return (stack,)
        return self.parser.feed(stack, self.spec.terminals[terminal].name)

    def fresh(self, stack: Stack) -> CfgState:
        return CfgState(stack, self.start_of(stack))

    @cached_property
    def initial(self) -> CfgStates:
        return frozenset([self.fresh(self.parser.initial)])

    def emit(self, stack: Stack, lex: int) -> list[Stack]:
        """The stacks after emitting the lexeme in `lex` (one per terminal it may be)."""
        return [after for term in self.lexer.emits(lex) for after in self.step(stack, term)]

    def settled(self, stack: Stack, lex: int) -> list[CfgState]:
        """A complete lexeme that cannot grow is emitted (no configuration if the parser refuses)."""
        if self.lexer.live(lex) or not self.lexer.emits(lex):
            return [CfgState(stack, lex)]
        return [self.fresh(after) for after in self.emit(stack, lex)]

    def advance(self, states: CfgStates, data: bytes) -> CfgStates | None:
        """The state after reading `data`, or None if no configuration can read it."""
        configs, lexer, exact = {(c.stack, c.lex) for c in states}, self.lexer, self.spec.exact
        for b in data:
            nxt = set()
            for stack, s in configs:
                n = lexer.step(s, b)
                if n >= 0:
                    nxt.add((stack, n))
                if exact or n < 0:
                    for after in self.emit(stack, s):
                        n = lexer.step(self.start_of(after), b)
                        if n >= 0:
                            nxt.add((after, n))
            if not nxt:
                return None
            configs = nxt
        out = {c for stack, s in configs for c in self.settled(stack, s)}
        if len(out) > MAX_CONFIGS:  # cut between tokens only: a mask is always its state's
            out = sorted(out, key=_config_order)[:MAX_CONFIGS]
        return frozenset(out) or None

    def readable_bytes(self, states: CfgStates) -> np.ndarray:
        """bool [256], a superset of the bytes the state can read: each configuration's lexeme
        going on, and where it may end, the first bytes of what its parser takes next (the
        lexer's start row for those terminals and the ignored ones)."""
        out = np.zeros(256, dtype=bool)
        for config in states:
            out |= self.lexer.live_bytes(config.lex)
            if not self.lexer.is_start(config.lex):
                for after in self.emit(config.stack, config.lex):
                    out |= self.lexer.live_bytes(self.start_of(after))
        return out

    def advance_bytes(self, states: CfgStates, data: bytes) -> CfgStates | None:
        return self.advance(states, data)

    @cached_property
    def _forced(self) -> BoundedCache[CfgStates, bytes]:
        return BoundedCache(MAX_CACHED_MASKS)

    def forced_bytes(self, states: CfgStates) -> bytes:
        """The bytes every completion of the state continues with (grammar.forced), cached per state."""
        forced = self._forced.get(states)
        if forced is None:
            forced = self._forced.put(states, forced_bytes(self, states))
        return forced

    @cached_property
    def _steps(self) -> BoundedCache[tuple[CfgStates, int], CfgStates | None]:
        return BoundedCache(MAX_CACHED_STEPS)

    def next_state(self, state: CfgStates, token_id: int) -> CfgStates | None:
        """The state after a real token (not EOS), None if not allowed: advance over its bytes,
        cached per (state, token), so the sequences of a grammar that meet a state again take
        each token of it in a lookup (and share the next state's object, its hash computed once)."""
        key = (state, token_id)
        if key in self._steps:
            return self._steps[key]
        data = self.token_data(token_id)
        return self._steps.put(key, None if data is None else self.advance(state, data))

    def accepts_eos(self, states: CfgStates) -> bool:
        mask = self._masks.get(states)  # a state met before: its row knows
        return mask.accepting if mask is not None else any(self._accepts_eos(c) for c in states)

    def _accepts_eos(self, config: CfgState) -> bool:
        if self.lexer.is_start(config.lex):
            return self.parser.accepts_end(config.stack)
        return any(self.parser.accepts_end(after) for after in self.emit(config.stack, config.lex))

    # ---- masks --------------------------------------------------------------------------------
    @cached_property
    def store(self) -> MaskStore:
        return MaskStore(self.trie, self.vocab_size, self.spec.exact)

    @cached_property
    def _roots(self) -> dict[int, Expansion]:
        return {}

    @cached_property
    def _masks(self) -> BoundedCache[CfgStates, CfgMask]:
        return BoundedCache(MAX_CACHED_MASKS)

    @cached_property
    def _words(self) -> BoundedCache[CfgState, np.ndarray]:
        return BoundedCache(MAX_CACHED_MASKS)

    @cached_property
    def _shared_roots(self) -> dict[tuple[int, int], Expansion]:
        return {}

    def root(self, lex: int) -> Expansion:
        """The vocabulary read from a lexer state: one walk per state, or per family of states
        where one terminal is alive that read alike (Lexer.shared_key: keys with values alike)."""
        exp = self._roots.get(lex)
        if exp is None:
            with unit_of_work():
                family, terminal = self.lexer.shared_key(lex) or (None, None)
                shared = self._shared_roots.get(family)
                if shared is not None:
                    exp = shared.relabeled(terminal)
                else:
                    exp = self.store.root(*self.lexer.arrays(), lex)
                    if family is not None:
                        self._shared_roots[family] = exp
                self._roots[lex] = exp
        return exp

    def words(self, config: CfgState) -> np.ndarray:
        """uint32 [W]: the real tokens allowed in a configuration (no EOS)."""
        words = self._words.get(config)
        if words is None:
            with unit_of_work():
                words = self._words.put(config, self._build_words(config))
        return words

    def _build_words(self, config: CfgState) -> np.ndarray:
        exp = self.root(config.lex)
        words = exp.inside.copy()
        for after in self.emit(config.stack, config.lex):
            if self.spec.exact:
                words |= self.words(self.fresh(after))
            else:
                words |= self.words(self.fresh(after)) & exp.dying_first
        self._add_crossings(exp, config.stack, words)
        return words

    def _add_crossings(self, exp: Expansion, stack: Stack, words: np.ndarray) -> None:
        for accept_id, crossing in exp.crossings.items():
            for term in self.lexer.emitted(accept_id):
                for after in self.step(stack, term):
                    start = self.start_of(after)
                    child = crossing.children.get(start)
                    if child is None:
                        with unit_of_work():
                            child = crossing.children[start] = self.store.subtrees(
                                *self.lexer.arrays(), start, crossing.roots)
                    words |= child.inside
                    self._add_crossings(child, after, words)

    def state_mask(self, states: CfgStates) -> CfgMask:
        mask = self._masks.get(states)
        if mask is None:
            mask = self._masks.put(states, self._build_mask(states))
        return mask

    def _build_mask(self, states: CfgStates) -> CfgMask:
        configs = iter(states)
        words = self.words(next(configs)).copy()
        for config in configs:
            words |= self.words(config)
        accepting = any(self._accepts_eos(c) for c in states)
        only_eos = accepting and not words.any()
        if accepting:
            ids = self.eos_ids
            set_bits(words, ids)
        return CfgMask(torch.from_numpy(words.view(np.int32)), accepting, only_eos)

    @cached_property
    def eos_ids(self) -> np.ndarray:
        return np.array(sorted(i for i in self.eos_token_ids if i < self.vocab_size),
                        dtype=np.int64)

    @cached_property
    def eos_row(self) -> torch.Tensor:
        words = empty_words(self.vocab_size)
        ids = self.eos_ids
        set_bits(words, ids)
        return torch.from_numpy(words.view(np.int32))

    # ---- closing before the budget ------------------------------------------------------------
    @cached_property
    def terminal_spellings(self) -> list[bytes | None]:
        return [spelling_by_distance(d, d.start) for d in self.terminal_dfas]

    @cached_property
    def _completions(self) -> BoundedCache[CfgStates, bytes | None]:
        return BoundedCache(MAX_CACHED_MASKS)

    def completion(self, state: CfgStates) -> bytes | None:
        """Short bytes that complete `state` (cfg.complete), cached per state."""
        if state not in self._completions:
            with unit_of_work():
                self._remember(state, shortest_completion(self, state))
        return self._completions[state]

    def closing_completion(self, state: CfgStates) -> bytes | None:
        """A completion of a state whose bounded search found none within reach (it gave up, as
        inside an object open to any key, where every short text is a new state): the
        depth-first search's, which closes what is open first (not the shortest), cached as the
        state's; None where that finds none either (or an unbounded search found none before)."""
        if state not in self._completions:
            with unit_of_work():
                path = depth_first_completion(self, state)
            self._remember(state, path)
        return self._completions[state]

    def _remember(self, state: CfgStates, path: bytes | None) -> None:
        """Cache a state's completion, and the rest of it for each state along the way (later
        searches that reach one of them stop there: without them, searches from states near a
        long completion's path give up where they would have found it, and rows go unchecked)."""
        self._completions.put(state, path)
        for i in range(len(path or b"") - 1):
            state = self._byte_step(state, path[i])
            if state is None:
                return
            self.inherit_completion(state, path[i + 1:])

    @cached_property
    def _byte_steps(self) -> BoundedCache[tuple[CfgStates, int], CfgStates | None]:
        return BoundedCache(MAX_CACHED_STEPS)

    def _byte_step(self, state: CfgStates, byte: int) -> CfgStates | None:
        """advance over one byte, cached per (state, byte): completions found from different
        states soon run along the same states (the closing brackets of one structure)."""
        key = (state, byte)
        if key in self._byte_steps:
            return self._byte_steps[key]
        return self._byte_steps.put(key, self.advance(state, bytes((byte,))))

    def known_completion(self, state: CfgStates) -> bytes | None:
        """The completion of `state` found so far, if any (no search)."""
        return self._completions.get(state)

    @cached_property
    def _none_below(self) -> BoundedCache[CfgStates, int]:
        return BoundedCache(MAX_CACHED_MASKS)  # state -> a bounded search found no completion shorter

    def completion_within(self, state: CfgStates, limit: int) -> bytes | None:
        """A completion of `state` at most `limit` bytes long, if one is found: the known one, or
        a search that stops past `limit` (much cheaper than an unbounded one when it fails)."""
        known = self.known_completion(state)
        if known is not None or state in self._completions or self._none_below.get(state, 0) > limit:
            return known if known is not None and len(known) <= limit else None
        with unit_of_work():
            path, reached = search_completion(self, state, limit)
            if path is not None:
                self._remember(state, path)
            else:  # a search that gave up (MAX_NODES) before `limit` is not repeated for it either
                self._none_below.put(state, max(reached, limit + 1))
        return path

    def inherit_completion(self, state: CfgStates, rest: bytes) -> None:
        """Record `rest` as completing `state` (the rest of a completion that a token started),
        where no shorter one is known."""
        known = self._completions.get(state)
        if state != TERMINATED and (known is None or len(rest) < len(known)):
            self._completions.put(state, rest)

    @cached_property
    def _next_completions(self) -> BoundedCache[CfgStates, NextCompletions]:
        return BoundedCache(MAX_CACHED_NEXT_COMPLETIONS, policy="lru")

    def next_completions(self, state: CfgStates, budget: int) -> NextCompletions:
        """The checked tokens' completions after them (cfg.budget), cached for the states most
        recently used near their budget (an answer for a budget holds for every smaller one)."""
        cached = self._next_completions.lookup(state)
        if cached is None or cached.searched < budget:
            with unit_of_work():
                cached = self._next_completions.put(state, next_completions(self, state, budget))
        return cached

    @cached_property
    def _inside_groups(self) -> BoundedCache[int, InsideGroups]:
        return BoundedCache(MAX_CACHED_INSIDE_GROUPS, policy="lru")

    def inside_groups(self, lex: int) -> InsideGroups:
        """The tokens that stay inside the lexeme of lexer state `lex`, grouped by where they
        lead (cfg.budget), cached for the lexer states most recently used near a budget."""
        groups = self._inside_groups.lookup(lex)
        if groups is None:
            with unit_of_work():
                groups = self._inside_groups.put(lex, inside_groups(self, lex))
        return groups

    @cached_property
    def closing_zone(self) -> int:
        """Budgets (tokens) below which rows keep only the tokens that can still close in time;
        above it every token is allowed (one token would have to add more than this many bytes
        to the shortest completion to matter there)."""
        return max(STEER_FROM, 2 * self.steer_margin)

    @cached_property
    def closing_window(self) -> int:
        """Tokens past a state's own completion within which its row keeps only checked tokens
        (before it, a token would have to add more than this to the completion to matter: one
        that opens an optional member adds that member's shortest text, rarely more, and a text
        takes at most a token per byte). The margin itself: a window wider than needed would
        narrow every short answer (a max_tokens of 64 on json_object would leave only `{}`)."""
        return self.steer_margin

    def budget_row(self, state: CfgStates, budget: int) -> torch.Tensor:
        """The state's row; near the budget (within closing_window tokens of the state's short
        completion) only the checked tokens after which a known completion fits in `budget` more
        tokens (its greedy tokenization's: cfg.budget), and EOS where allowed; where none fits,
        those whose completion is shortest. The whole row where no completion is known."""
        full = self.state_mask(state)
        if budget >= self.closing_zone:
            return full.row
        # A bounded search: an unbounded one can take seconds where no short completion exists.
        own = (self.completion_within(state, budget + self.closing_window) or self.known_completion(state)
               or self.closing_completion(state))
        if own is None or self.text_tokens(own) + self.closing_window <= budget:
            return full.row
        closing = self.next_completions(state, budget)
        if not closing.lengths:
            return self.eos_row if full.accepting else full.row
        return closing.row(budget if full.accepting else max(budget, closing.lengths[0]))  # or head for the end

    def text_tokens(self, text: bytes) -> int:
        """The tokens that follow `text` (a completion) at most: its greedy tokenization's count,
        every token of which the masks allow on the way (each allows the tokens whose bytes the
        grammar accepts); its bytes where some byte starts no token."""
        count = self.trie.greedy_count(text, self.vocab_size)
        return len(text) if count is None else count

    def token_data(self, token_id: int) -> bytes | None:
        t = self.trie
        if not 0 <= token_id < min(self.vocab_size, t.size) or t.token_node[token_id] < 0:
            return None
        return t.token_bytes(token_id)


def _config_order(config: CfgState) -> tuple:
    return len(config.stack), config.stack, config.lex


class CfgMatcher(StateWalk):
    """A sequence's walk through a CfgGrammar."""
    terminated = TERMINATED

    def __init__(self, grammar: CfgGrammar):
        super().__init__(grammar, grammar.initial)

    def _stepped(self, state: CfgStates, nxt: CfgStates, token_id: int) -> None:
        """A token that starts the known completion leaves the rest as the next one."""
        path, data = self.grammar.known_completion(state), self.grammar.token_data(token_id)
        if path and data and path.startswith(data):
            self.grammar.inherit_completion(nxt, path[len(data):])

    def distance_to_complete(self) -> int:
        """Bytes of a short completion (cfg.complete; not always the shortest); 0 if none found."""
        state = self._states[-1]
        path = None if state == TERMINATED else self.grammar.completion(state)
        return len(path) if path else 0
