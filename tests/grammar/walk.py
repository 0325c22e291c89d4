"""Drive a Grammar the way the engine does: fill a bitmask row, pick an allowed token, accept it."""
import json
import random
from collections import deque
from functools import cached_property

import numpy as np

from gdserve.grammar import Grammar, Matcher, allocate_token_bitmask


def allowed_ids(matcher: Matcher) -> set[int]:
    """The token ids the matcher's bitmask row allows (unpacked by numpy: little-endian words,
    little bit order)."""
    bitmask = allocate_token_bitmask(1, matcher.grammar.vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].numpy().astype("<i4").view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def feed(grammar: Grammar, token_ids: list[int]) -> bool:
    """True if the grammar accepts token_ids and then EOS."""
    matcher = grammar.matcher()
    return (all(matcher.accept_token(t) for t in token_ids)
            and matcher.accept_token(min(grammar.eos_token_ids)))


class Walker:
    """Random complete outputs of a grammar. Each state's bitmask row is checked once against the
    index's transitions (EOS exactly in accepting states, nothing past the vocabulary)."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self._checked: set[int] = set()

    @cached_property
    def transitions(self) -> dict[int, dict[int, int]]:
        """state -> {token id: next state} for real tokens (EOS left out), every state reachable
        from the initial one."""
        out: dict[int, dict[int, int]] = {}
        todo = [self.grammar.initial_state]
        while todo:
            state = todo.pop()
            if state not in out:
                out[state] = self.grammar.transitions(state)
                todo.extend(set(out[state].values()) - out.keys())
        return out

    @cached_property
    def steps_to_accept(self) -> dict[int, int]:
        """Fewest tokens from each state to an accepting state (reverse BFS)."""
        parents: dict[int, set[int]] = {}
        for state, edges in self.transitions.items():
            for next_state in edges.values():
                parents.setdefault(next_state, set()).add(state)
        dist = {s: 0 for s in self.transitions if self.grammar.is_final(s)}
        queue = deque(dist)
        while queue:
            state = queue.popleft()
            for parent in parents.get(state, ()):
                if parent not in dist:
                    dist[parent] = dist[state] + 1
                    queue.append(parent)
        return dist

    def check_row(self, matcher: Matcher, state: int) -> None:
        if state in self._checked:
            return
        allowed, eos = allowed_ids(matcher), self.grammar.eos_token_ids
        assert allowed - eos == set(self.transitions.get(state, {}))
        assert allowed & eos == (eos if self.grammar.is_final(state) else set())
        self._checked.add(state)

    def walk(self, rng: random.Random, random_steps: int) -> list[int]:
        """Token ids of one complete output: up to random_steps tokens drawn uniformly from the
        allowed ones (EOS included), then the shortest way to an accepting state, then EOS (not
        returned)."""
        matcher, state, out = self.grammar.matcher(), self.grammar.initial_state, []
        eos = min(self.grammar.eos_token_ids)
        while True:
            self.check_row(matcher, state)
            edges = self.transitions.get(state, {})
            accepting = self.grammar.is_final(state)
            if len(out) < random_steps:
                token = rng.choice(sorted(edges) + [eos] * accepting)
            elif accepting:
                token = eos
            else:
                best = min(self.steps_to_accept[n] for n in edges.values())
                token = rng.choice(sorted(t for t, n in edges.items()
                                          if self.steps_to_accept[n] == best))
            assert matcher.accept_token(token)
            if token == eos:
                assert matcher.is_terminated()
                return out
            state = edges[token]
            out.append(token)


def single_byte_ids(grammar) -> dict[int, int]:
    out = {}
    for t in range(grammar.vocab_size):
        data = grammar.token_data(t)
        if data is not None and len(data) == 1:
            out.setdefault(data[0], t)
    return out


def token_ids_by_bytes(grammar) -> dict[bytes, int]:
    out = {}
    for t in range(grammar.vocab_size):
        data = grammar.token_data(t)
        if data:
            out.setdefault(data, t)
    return out


def random_split(data: bytes, by_bytes: dict[bytes, int], rng: random.Random) -> list[int]:
    """Token ids spelling `data` in random chunks that are tokens; [] if some byte is none."""
    out, pos = [], 0
    while pos < len(data):
        size = next((n for n in rng.sample(range(1, 7), 6) if data[pos:pos + n] in by_bytes), 0)
        if not size:
            return []
        out.append(by_bytes[data[pos:pos + size]])
        pos += size
    return out


def accepts_all(grammar, ids: list[int]) -> bool:
    m = grammar.matcher()
    for t in ids:
        if t not in allowed_ids(m) or not m.accept_token(t):
            return False
    eos = min(grammar.eos_token_ids)
    return eos in allowed_ids(m) and m.accept_token(eos) and m.is_terminated()


def mutate(text: str, rng: random.Random) -> str:
    i = rng.randrange(len(text) + 1)
    op = rng.choice(["delete", "insert", "duplicate"])
    if op == "delete" and text:
        return text[:max(0, i - 1)] + text[i:]
    if op == "duplicate":
        return text[:i] + text[i:i + 3] + text[i:]
    return text[:i] + rng.choice("{}[]()\",:;'*+-=.x0 \\") + text[i:]


def tokenized_mutants(tokenizer, grammar, texts: list[str], rng: random.Random):
    """(mutant, its token ids) for each text mutated twice, skipping lossy tokenizations."""
    for text in texts:
        mutant = mutate(mutate(text, rng), rng)
        ids = tokenizer.encode(mutant, add_special_tokens=False)
        if b"".join(grammar.token_data(t) for t in ids) == mutant.encode():
            yield mutant, ids


def is_json(text: str) -> bool:
    """Whether text parses as JSON (lark's own lexer reads some grammar sentences otherwise than ours)."""
    try:
        json.loads(text)
        return True
    except ValueError:
        return False
