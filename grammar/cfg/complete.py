"""Shortest completions of a CfgGrammar state, for steering a sequence to finish within its token
budget (CfgMatcher.fill_next_token_bitmask(budget=...)).

A uniform-cost search over matcher states: from a state, append the shortest spelling of a
terminal (optionally after the shortest ignored text, where adjacent lexemes would merge) or the
shortest end of the current lexeme, and read it with CfgGrammar.advance, so every path is text
the matcher accepts; the first state that accepts EOS ends the search. Stacks more than
MAX_DEEPER states deeper than the start are not explored (a completion closes what is open, but
from the start of a large schema it must open every required member's structure, many levels
deep), and the search gives up after MAX_NODES states.

From the start, the grammar's rules give the answer without a search (shortest_sentence): each
nonterminal's shortest yield, terminals at their shortest spellings, found once over the rules.
"""
import heapq
import itertools
from functools import lru_cache

import numpy as np

from gdserve.grammar.token_index import UNREACHABLE, ByteDFA

MAX_NODES = 3000
MAX_DEEPER = 64
DEPTH_WEIGHT = 64  # depth_first_completion's bytes per stack entry
NO_END = 1 << 30  # search_completion's bound where no completion exists at all


@lru_cache(maxsize=1024)
def _class_bytes(classes: bytes) -> tuple[tuple[int, int], ...]:
    """(class, its representative byte) for each byte class of a DFA (its classes array as bytes),
    a printable byte preferred as the representative."""
    reps: dict[int, int] = {}
    for b in sorted(range(256), key=lambda b: (not 32 < b < 127, b)):
        reps.setdefault(classes[b], b)
    return tuple(reps.items())


def shortest_spelling(dfa: ByteDFA, start: int) -> bytes | None:
    """The shortest bytes from `start` to an accepting state (printable bytes preferred)."""
    reps, dead, final, trans = _class_bytes(dfa.classes.tobytes()), dfa.dead, dfa.final, dfa.trans
    prev, todo = {start: None}, [start]
    while todo:
        nxt_todo = []
        for s in todo:
            if final[s]:
                out = bytearray()
                while prev[s] is not None:
                    s, b = prev[s]
                    out.append(b)
                return bytes(reversed(out))
            row = trans[s].tolist()
            for c, b in reps:
                n = row[c]
                if n != dead and n not in prev:
                    prev[n] = (s, b)
                    nxt_todo.append(n)
        todo = nxt_todo
    return None


def spelling_by_distance(dfa: ByteDFA, state: int) -> bytes | None:
    """shortest_spelling read off the distances of a DFA whose table never changes: from each
    state the first byte (printable preferred) that leads one byte closer to accepting."""
    dist = dfa.distance
    if dist[state] >= UNREACHABLE:
        return None
    reps, trans, out = _class_bytes(dfa.classes.tobytes()), dfa.trans, bytearray()
    while dist[state]:
        closer = dist[state] - 1
        row = trans[state].tolist()
        c, b = next((c, b) for c, b in reps if dist[row[c]] == closer)
        out.append(b)
        state = row[c]
    return bytes(out)


def shortest_completion(grammar, state) -> bytes | None:
    """Bytes that take `state` (a set of configurations) to one where EOS is allowed, or None if
    none was found: from the start the shortest sentence where the matcher reads it whole, else
    search_completion without a bound, else depth_first_completion."""
    if state == grammar.initial:
        text = shortest_sentence(grammar.spec.rules, grammar.spec.terminals, grammar.terminal_spellings)
        if text is not None and _completes(grammar, state, text):
            return text
    return search_completion(grammar, state)[0] or depth_first_completion(grammar, state)


def _completes(grammar, state, text: bytes) -> bool:
    after = grammar.advance(state, text) if text else state
    return after is not None and grammar.accepts_eos(after)


def shortest_sentence(rules, terminals, spellings: list[bytes | None], start: str = "start") -> bytes | None:
    """The shortest text the rules derive from `start`, each terminal at its shortest spelling
    (Knuth's generalization of Dijkstra's algorithm: a rule's cost is known once its symbols'
    are, and the cheapest rule of a nonterminal is final when taken from the heap). None where
    the rules derive no text (or are not kept). Adjacent lexemes may read as others in the
    matcher: callers check the text."""
    if not rules:
        return None
    spelled = {t.name: spellings[i] for i, t in enumerate(terminals) if spellings[i] is not None}
    cost: dict[str, int] = {}
    chosen: dict[str, tuple[str, ...]] = {}
    waiting, partial, uses, heap = [], [], {}, []
    for i, rule in enumerate(rules):
        nonterminals = [s for s in rule.expansion if s not in spelled]
        partial.append(sum(len(spelled[s]) for s in rule.expansion if s in spelled))
        waiting.append(len(nonterminals))
        for s in nonterminals:
            uses.setdefault(s, []).append(i)
        if not nonterminals:
            heapq.heappush(heap, (partial[i], i))
    while heap:
        total, i = heapq.heappop(heap)
        origin = rules[i].origin
        if origin in cost:
            continue
        cost[origin], chosen[origin] = total, rules[i].expansion
        for j in uses.get(origin, ()):  # once per occurrence
            partial[j] += total
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (partial[j], j))
    if start not in cost:
        return None
    out, todo = bytearray(), [start]
    while todo:
        symbol = todo.pop()
        if symbol in spelled:
            out += spelled[symbol]
        else:
            todo.extend(reversed(chosen[symbol]))
    return bytes(out)


def depth_first_completion(grammar, state) -> bytes | None:
    """A completion, not the shortest, where search_completion gives up (a large schema whose
    shortest completion opens many nested required members, so that every cheaper text is
    explored first): best-first on the text's length plus DEPTH_WEIGHT bytes per parser stack
    entry, so texts that close what is open come first. None if none is found in MAX_NODES."""
    if grammar.accepts_eos(state):
        return b""
    spells = grammar.terminal_spellings
    ignore = [spells[t] for t in grammar.spec.ignore if spells[t]]
    sep = min(ignore, key=len) if ignore else None
    heap, seen, order = [(0, 0, state, b"")], {state}, itertools.count(1)
    while heap and len(seen) < MAX_NODES:
        _, _, cur, path = heapq.heappop(heap)
        for piece in sorted(dict.fromkeys(p for c in cur for p in _pieces(grammar, c, spells, sep)), key=len):
            nxt = grammar.advance(cur, piece)
            if nxt is None or nxt in seen:
                continue
            seen.add(nxt)
            if grammar.accepts_eos(nxt):
                return path + piece
            depth = min(len(c.stack) for c in nxt)
            heapq.heappush(heap, (len(path) + len(piece) + DEPTH_WEIGHT * depth, next(order), nxt, path + piece))
    return None


def search_completion(grammar, state, max_cost: int | None = None) -> tuple[bytes | None, int]:
    """(a short completion, None if none was found; the length below which the search looked
    everywhere it goes: none shorter was found). A state reached whose completion the grammar
    already knows ends that branch with the known rest (so the answer is the shortest only up to
    those rests). Dijkstra whose successors enter the heap one at
    a time, shortest piece first (a state's next sibling is pushed when the one before it is
    taken), so a state with thousands of next terminals (a large enum) costs only the pieces the
    search actually reaches; with max_cost, it stops past that length."""
    spells = grammar.terminal_spellings
    ignore = [spells[t] for t in grammar.spec.ignore if spells[t]]
    sep = min(ignore, key=len) if ignore else None
    depth = min(len(c.stack) for c in state)
    if grammar.accepts_eos(state):
        return b"", 0
    heap, seen, count, order = [], {state}, 0, itertools.count()
    _push_first(heap, order, grammar, state, b"", 0, spells, sep)
    while heap and count < MAX_NODES:
        cost, _, cur, path, pieces, i = heapq.heappop(heap)
        if max_cost is not None and cost > max_cost:
            return None, cost
        if pieces is None:  # a state whose completion was known: path is whole
            return path, cost
        if i + 1 < len(pieces):
            heapq.heappush(heap, (cost - len(pieces[i]) + len(pieces[i + 1]), next(order),
                                  cur, path, pieces, i + 1))
        nxt = grammar.advance(cur, pieces[i])
        if nxt is None or nxt in seen or min(len(c.stack) for c in nxt) > depth + MAX_DEEPER:
            continue
        seen.add(nxt)
        count += 1
        if grammar.accepts_eos(nxt):
            return path + pieces[i], cost
        known = grammar.known_completion(nxt)
        if known is not None:  # the rest is known: a candidate, taken if nothing shorter comes first
            heapq.heappush(heap, (cost + len(known), next(order), None, path + pieces[i] + known, None, 0))
            continue
        _push_first(heap, order, grammar, nxt, path + pieces[i], cost, spells, sep)
    return None, (heap[0][0] if heap else NO_END)


def _push_first(heap: list, order, grammar, state, path: bytes, cost: int, spells: list,
                sep: bytes | None) -> None:
    """Push the shortest piece after `state`; the rest follow it one by one (shortest_completion)."""
    pieces = sorted(dict.fromkeys(p for c in state for p in _pieces(grammar, c, spells, sep)), key=len)
    if pieces:
        heapq.heappush(heap, (cost + len(pieces[0]), next(order), state, path, pieces, 0))


def _pieces(grammar, config, spells: list, sep: bytes | None) -> list[bytes]:
    """Text to try after a configuration: the end of an unfinished lexeme, or the next terminals
    (those the parser takes once a complete pending lexeme is emitted)."""
    stacks = [config.stack]
    if not grammar.lexer.is_start(config.lex):
        stacks = grammar.emit(config.stack, config.lex)
        if not grammar.lexer.emits(config.lex):
            end = grammar.lexer.shortest_end(config.lex)
            return [end] if end else []
    out = []
    for stack in stacks:
        for term in grammar.parser.acceptable(stack) - grammar.spec.ignore:
            if spells[term]:
                out.append(spells[term])
                if sep:
                    out.append(sep + spells[term])
    return out


def prefix_tokens(grammar, data: bytes) -> np.ndarray:
    """Token ids (below vocab_size) whose bytes are a non-empty prefix of `data`."""
    t = grammar.trie
    ids, node = [], -1
    for b in data:
        child, end = node + 1, (int(t.skip[node]) if node >= 0 else len(t.byte))
        while child < end and t.byte[child] != b:
            child = int(t.skip[child])  # next sibling
        if child >= end:
            break
        node = child
        ids.extend(t.tok_ids[t.tok_ptr[node]:t.tok_ptr[node + 1]].tolist())
    return np.array([i for i in ids if i < grammar.vocab_size], dtype=np.int64)
