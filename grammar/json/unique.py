"""uniqueItems over scalar items, kept by the matcher beside its automaton.

No regex of reasonable size holds "no two items equal" over an unbounded item set (`set[str]`),
so json.schema builds such arrays without it and the matcher keeps, per sequence, a Scan
(json.unique_scan) of the text read: the unique arrays open and their items so far. A token is
allowed where the automaton allows it and
- no item it completes equals an earlier item of its array (the token that would complete a
  duplicate is refused; one that continues a longer item is not), and
- an item it leaves open (or owes, after a `,`) can still complete as a new value (within the
  budget, when one is given): a depth-first search over the automaton's bytes from the state
  after the token, bounded by MAX_SEARCH_STEPS bytes taken and MAX_SEARCH_TRIES bytes tried (past
  either the token is refused: a narrowing, never a relaxation).
So every allowed token keeps the sequence completable and the closing guarantee carries over:
an array that can take no other distinct item can still close.

Only tokens that could break either rule are checked per fill (the rest of the row is the
automaton's): inside an open string item, those with a quote or backslash and those that spell
the rest of an earlier item; between and inside other items, every allowed token; outside unique
arrays, the few that open one and complete two items.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
import torch

from gdserve.grammar.allowance import unit_of_work
from gdserve.grammar.bounded_cache import BoundedCache
from gdserve.grammar.cfg.grammar import CfgGrammar
from gdserve.grammar.json.unique_paths import Path, unique_array_paths
from gdserve.grammar.json.unique_scan import Scan, Scanner, decoded_prefix, items_read, path_matcher
from gdserve.grammar.matcher import Grammar, write_row
from gdserve.grammar.token_index import TokenTrie
from gdserve.kernels.bitmask import clear_bits, unpack_words

MAX_SEARCH_STEPS = 4096   # bytes the automaton takes in one viability search before it refuses the token
MAX_SEARCH_TRIES = 16 * MAX_SEARCH_STEPS  # bytes tried, taken or not (most are not: a few fit a state)
# Bytes in the order the search tries them: what closes an item first, then what spells one,
# zero after the other digits (trailing zeros of a fraction or leading zeros of an exponent spell
# the same number again, without end).
_SEARCH_ORDER = tuple(dict.fromkeys([*b'",]}1234567890', *range(97, 123), *range(65, 91), *range(256)]))
MAX_CACHED_VIABILITY = 1 << 15  # viability answers a grammar keeps for its matchers (many tokens lead to one scan)
MAX_CACHED_NEXT_BYTES = 1 << 16  # (state, byte order) -> the bytes a state reads, in that order
_UNSEARCHED = object()
_VOCAB_TABLES: dict[str, "_VocabTables"] = {}


@lru_cache(maxsize=1024)
def _search_order_with_last(last: frozenset[int]) -> tuple[int, ...]:
    """_SEARCH_ORDER with the bytes `last` moved to its end (one tuple per set: see next_bytes)."""
    return tuple(b for b in _SEARCH_ORDER if b not in last) + tuple(b for b in _SEARCH_ORDER if b in last)


def with_unique_items(grammar: Grammar | CfgGrammar, schema: object, pointers: list[str]) -> "UniqueItemsGrammar":
    """The grammar, wrapped to keep the uniqueItems at `pointers` (json.schema's unique_items)."""
    return UniqueItemsGrammar(grammar, unique_array_paths(schema, pointers))


@dataclass
class UniqueItemsGrammar:
    """A compiled JSON Schema whose matchers also refuse duplicate items; everything else (the
    vocab_size, the report, ...) is the automaton's."""
    base: Grammar | CfgGrammar
    paths: frozenset[Path]

    def matcher(self) -> "UniqueItemsMatcher":
        return UniqueItemsMatcher(self)

    @cached_property
    def needs(self) -> BoundedCache[tuple, int | None]:
        """(automaton state, scan) -> the viability search's answer without a budget: a scan is
        all a matcher's uniqueness state, so the grammar's matchers share the answers."""
        return BoundedCache(MAX_CACHED_VIABILITY)

    @cached_property
    def viability(self) -> BoundedCache[tuple, bool]:
        """(automaton state, scan, budget) -> whether a bounded search found a new value."""
        return BoundedCache(MAX_CACHED_VIABILITY)

    @cached_property
    def byte_walk(self) -> "_ByteWalk":
        """The automaton read byte by byte, shared by the grammar's matchers."""
        return _ByteWalk(self.base)

    def __getstate__(self) -> dict:
        return {"base": self.base, "paths": self.paths}

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("base", "paths"):
            raise AttributeError(name)
        return getattr(self.base, name)


@dataclass
class _VocabTables:
    """Per vocabulary: which tokens hold the bytes that can end or span items."""
    quote_or_escape: np.ndarray   # bool [V]: a `"` or `\\`
    comma: np.ndarray             # bool [V]: a `,` (a token that completes two items has one)
    closing: np.ndarray           # bool [V]: a `]` or `}` (leaves a container)
    opens_then_comma: np.ndarray  # bool [V]: a `[` followed later by `,`
    by_bytes: dict[bytes, list[int]] = field(repr=False)

    @classmethod
    def of(cls, trie: TokenTrie) -> "_VocabTables":
        tables = _VOCAB_TABLES.get(trie.fingerprint)
        if tables is None:
            tables = _VOCAB_TABLES[trie.fingerprint] = cls.build(trie)
        return tables

    @classmethod
    def build(cls, trie: TokenTrie) -> "_VocabTables":
        n = trie.size
        data = [trie.token_bytes(i) if trie.token_node[i] >= 0 else b"" for i in range(n)]
        by_bytes: dict[bytes, list[int]] = {}
        for i, d in enumerate(data):
            if d:
                by_bytes.setdefault(d, []).append(i)

        def has(test) -> np.ndarray:
            return np.fromiter((bool(d) and test(d) for d in data), dtype=bool, count=n)
        return cls(has(lambda d: b'"' in d or b"\\" in d), has(lambda d: b"," in d),
                   has(lambda d: b"]" in d or b"}" in d),
                   has(lambda d: b"[" in d and b"," in d[d.index(b"["):]), by_bytes)


class _ByteWalk:
    """The automaton read byte by byte: step, and bytes left to complete."""

    def __init__(self, grammar: Grammar | CfgGrammar):
        self.grammar = grammar
        self.cfg = isinstance(grammar, CfgGrammar)
        self._next_bytes: BoundedCache[tuple, tuple] = BoundedCache(MAX_CACHED_NEXT_BYTES)  # see next_bytes

    def next_bytes(self, state, order: tuple[int, ...]) -> tuple[int, ...]:
        """The bytes of `order` that the automaton may read from `state`: those of a regex
        automaton's row, cached per (state, order); every byte for a grammar. An order is keyed
        by identity: callers reuse one tuple per order (_byte_order's, _SEARCH_ORDER)."""
        if self.cfg:
            return order
        key = (state, id(order))
        out = self._next_bytes.get(key)
        if out is None or out[0] is not order:
            readable = self.grammar.readable_bytes(state).tolist()
            out = self._next_bytes.put(key, (order, tuple(b for b in order if readable[b])))
        return out[1]

    def step(self, state, data: bytes):
        if self.cfg:
            return self.grammar.advance(state, data)
        nxt = self.grammar.index.dfa.walk(state, data)
        return None if nxt == self.grammar.index.dfa.dead else nxt

    def distance(self, state) -> int:
        if self.cfg:
            path = self.grammar.completion(state)
            return 0 if path is None else len(path)
        return self.grammar.distance(state)


class UniqueItemsMatcher:
    """The automaton's matcher plus a Scan per accepted token (rollback pops both)."""

    def __init__(self, grammar: UniqueItemsGrammar):
        self.grammar = grammar
        self.base = grammar.base.matcher()
        self.scanner = Scanner(path_matcher(grammar.paths))
        self.walk = grammar.byte_walk
        self.trie: TokenTrie = grammar.base.trie if self.walk.cfg else grammar.base.index.trie
        self.tables = _VocabTables.of(self.trie)
        self._scans: list[Scan] = [Scan()]
        self._needs = grammar.needs
        self._viability = grammar.viability

    # ---- the grammar contract ------------------------------------------------------------------
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int = 0,
                                budget: int | None = None) -> None:
        write_row(bitmask, row, self.next_token_row(budget), self.grammar.vocab_size)

    def next_token_row(self, budget: int | None = None) -> torch.Tensor:
        """The automaton's row (its budget_row near the budget) less the tokens uniqueness
        refuses. Where the budget, counted a byte per token, would leave no token (the
        automaton's row then holds the tokens that bring completion closest), those that keep
        every item new are kept regardless of it."""
        row = self.base.next_token_row(budget)
        if self.base.is_terminated():
            return row
        words = self._refuse(row, budget)
        if budget is not None and not words.any():
            words = self._refuse(row, None)
        return torch.from_numpy(words.view(np.int32))

    def _refuse(self, row: torch.Tensor, budget: int | None) -> np.ndarray:
        words = row.numpy().view(np.uint32).copy()
        refused = [t for t in self._candidates(row).tolist() if not self._fits(t, budget)]
        if refused:
            clear_bits(words, refused)
        return words

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the automaton refuses it, it completes
        a duplicate item, or the item it leaves open can only complete as one."""
        if not self.base.accept_token(token_id):
            return False
        data = self._data(token_id)
        scan = self._scans[-1] if data is None else self._after(self._scans[-1], data, self.base.state, None)
        if scan is None:
            self.base.rollback(1)
            return False
        self._scans.append(scan)
        return True

    def rollback(self, num_tokens: int) -> None:
        self.base.rollback(num_tokens)
        if num_tokens:
            del self._scans[-num_tokens:]

    def is_terminated(self) -> bool:
        return self.base.is_terminated()

    def forced_bytes(self) -> bytes:
        """The base automaton's forced text: its language holds this one's, so every completion
        here continues with it too."""
        return self.base.forced_bytes()

    def distance_to_complete(self) -> int:
        return self.base.distance_to_complete()

    @property
    def state(self):
        return self.base.state

    # ---- uniqueness ------------------------------------------------------------------------------
    def _data(self, token_id: int) -> bytes | None:
        """A real token's bytes (None for EOS and tokens without any)."""
        trie = self.trie
        if not 0 <= token_id < trie.size or trie.token_node[token_id] < 0:
            return None
        return trie.token_bytes(token_id)

    def _fits(self, token_id: int, budget: int | None) -> bool:
        data = self._data(token_id)
        if data is None:
            return True
        state = self.walk.step(self.base.state, data)
        return state is not None and self._after(self._scans[-1], data, state, budget) is not None

    def _after(self, scan: Scan, data: bytes, state, budget: int | None) -> Scan | None:
        """The scan after `data` (the automaton then in `state`), None if the token is refused."""
        scan = self.scanner.feed(scan, data)
        if scan is None or not scan.owes_unique_item or self._viable(scan, state, budget):
            return scan
        return None

    def _viable(self, scan: Scan, state, budget: int | None) -> bool:
        """Whether the item open or owed can complete as a new value within `budget` bytes. A
        search without a budget, cached per (state, scan), answers every budget its witness fits
        (most of them: a budget binds only near max_tokens); a budget below that is searched."""
        need = self._needs.get((state, scan), _UNSEARCHED)
        if need is _UNSEARCHED:
            with unit_of_work():
                need = self._needs.put((state, scan), self._search(scan, state, None))
        if need is not None and (budget is None or need <= budget):
            return True
        if budget is None:
            return False
        key = (state, scan, budget)
        found = self._viability.get(key)
        if found is None:
            with unit_of_work():
                found = self._viability.put(key, self._search(scan, state, budget) is not None)
        return found

    def _search(self, start: Scan, state, budget: int | None) -> int | None:
        """The bytes a completion of the item open or owed as a value its array does not hold yet
        needs, the whole text counted (the most, along the way, of the bytes read plus the
        automaton's distance to completion: the least budget the witness fits); None where none
        is found within `budget`. A depth-first search over the automaton's bytes, the bytes that
        end items tried first (_byte_order), within MAX_SEARCH_STEPS bytes taken and
        MAX_SEARCH_TRIES tried."""
        stack, steps, tries = [(state, start, 0, 0)], 0, 0  # (automaton state, scan, bytes used, next byte)
        orders: dict[Scan, tuple[int, ...]] = {}
        while stack:
            st, sc, used, i = stack.pop()
            order = orders.get(sc) or orders.setdefault(sc, self._byte_order(sc))
            readable = self.walk.next_bytes(st, order)
            for i in range(i, len(readable)):
                b = readable[i]
                tries += 1
                if tries > MAX_SEARCH_TRIES:
                    return None
                nxt = self.walk.step(st, bytes((b,)))
                steps += nxt is not None
                if steps > MAX_SEARCH_STEPS:
                    return None
                after = None if nxt is None else self.scanner.byte(sc, b)
                if after is None or (budget is not None and used + 1 + self.walk.distance(nxt) > budget):
                    continue
                if self._settled(start, after):
                    # the stack holds the path's earlier states, one per depth
                    path = [(entry[0], entry[2]) for entry in stack] + [(st, used), (nxt, used + 1)]
                    return max(depth + self.walk.distance(s) for s, depth in path if depth)
                stack += [(st, sc, used, i + 1), (nxt, after, used + 1, 0)]
                break
        return None

    def _byte_order(self, scan: Scan) -> tuple[int, ...]:
        """_SEARCH_ORDER, but inside a string item the bytes that go on spelling an earlier item
        come last: any other byte the automaton takes leaves every earlier item behind, which
        settles the search at once (tried first, an enum's earlier value would be explored to
        its end, byte by byte, before any other value)."""
        chars = decoded_prefix(scan.text) if scan.in_string and scan.in_unique_item else None
        if chars is None:
            return _SEARCH_ORDER
        follow = {json.dumps(value[len(chars)], ensure_ascii=False)[1:-1].encode()[0]
                  for kind, value in scan.seen
                  if kind == "string" and len(value) > len(chars) and value.startswith(chars)}
        return _search_order_with_last(frozenset(follow)) if follow else _SEARCH_ORDER

    def _settled(self, start: Scan, scan: Scan) -> bool:
        """Whether the item owed at `start` is done in `scan` as a new value, or can only end as
        one (an open string that no earlier item begins with)."""
        if items_read(scan) != items_read(start) and len(scan.frames) <= len(start.frames):
            return True
        return scan.in_string and scan.in_unique_item and not self._near_seen(scan)

    def _near_seen(self, scan: Scan) -> bool:
        """Whether an open string item may still equal an earlier one (its characters so far
        begin one; an incomplete escape may)."""
        chars = decoded_prefix(scan.text)
        return chars is None or any(k[0] == "string" and k[1].startswith(chars) for k in scan.seen)

    def _candidates(self, row: torch.Tensor) -> np.ndarray:
        """The allowed tokens that might complete a duplicate or leave a hopeless item open."""
        scan, t = self._scans[-1], self.tables
        n = min(self.trie.size, self.grammar.vocab_size)
        bits = unpack_words(row.numpy(), n)
        seen = scan.seen
        if seen is None:
            risky = t.closing[:n] if scan.in_unique_array() else t.opens_then_comma[:n]
        elif not seen:
            risky = t.comma[:n]
        elif scan.in_string and decoded_prefix(scan.text) is not None:
            risky = t.quote_or_escape[:n].copy()
            for token_id in self._spelling_seen(scan):
                if token_id < n:
                    risky[token_id] = True
        else:
            return np.flatnonzero(bits)
        return np.flatnonzero(bits & risky)

    def _spelling_seen(self, scan: Scan) -> list[int]:
        """Tokens without quote or escape that continue the open string item along an earlier
        item's remaining characters."""
        chars, out = decoded_prefix(scan.text), []
        for kind, value in scan.seen:
            if kind == "string" and value.startswith(chars):
                rest = value[len(chars):].encode()
                for end in range(1, min(len(rest), self.trie.max_depth) + 1):
                    out += self.tables.by_bytes.get(rest[:end], ())
        return out

