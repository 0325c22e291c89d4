"""Random sentences of a Lark grammar (tests and `gdserve bench grammar`): a random derivation that
turns to the shortest expansions past a depth budget, each terminal spelled by a random walk of
its byte DFA, ignored text (when the grammar has some) between terminals at random. A sentence is
kept only if `accept` takes it (default: lark's own LALR parser accepts it; joined terminals can lex
differently)."""
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from gdserve.grammar.cfg.lexer import terminal_dfa
from gdserve.grammar.cfg.lark_spec import lark_to_spec
from gdserve.grammar.token_index import ByteDFA


@dataclass
class SentenceSampler:
    text: str                 # Lark source
    max_depth: int = 5
    accept: Callable[[str], bool] | None = None

    @cached_property
    def _lark(self):
        import lark
        return lark.Lark(self.text, parser="lalr")

    @cached_property
    def _rules(self) -> dict[str, list[list[tuple[bool, str]]]]:
        """nonterminal -> expansions, each a list of (is_terminal, name)."""
        out: dict[str, list] = {}
        for rule in self._lark.rules:
            out.setdefault(rule.origin.name, []).append([(s.is_term, s.name) for s in rule.expansion])
        return out

    @cached_property
    def _dfas(self) -> dict[str, ByteDFA]:
        spec = lark_to_spec(self.text)
        return {t.name: terminal_dfa(t) for t in spec.terminals}

    @cached_property
    def _ignore(self) -> list[str]:
        return list(self._lark.ignore_tokens)

    @cached_property
    def _height(self) -> dict[str, int]:
        """Fewest derivation levels to a terminal string, per nonterminal."""
        height: dict[str, int] = {}
        changed = True
        while changed:
            changed = False
            for name, expansions in self._rules.items():
                for exp in expansions:
                    if all(t or s in height for t, s in exp):
                        h = 1 + max((height[s] for t, s in exp if not t), default=0)
                        if h < height.get(name, 1 << 30):
                            height[name], changed = h, True
        return height

    def _expansion_height(self, exp) -> int:
        return max((self._height[s] for t, s in exp if not t), default=0)

    def terminals(self, rng: random.Random, name: str = "start", depth: int = 0) -> list[str]:
        expansions = self._rules[name]
        if depth >= self.max_depth:
            best = min(self._expansion_height(e) for e in expansions)
            expansions = [e for e in expansions if self._expansion_height(e) == best]
        out = []
        for is_term, sym in rng.choice(expansions):
            out.extend([sym] if is_term else self.terminals(rng, sym, depth + 1))
        return out

    def spell(self, rng: random.Random, name: str, max_len: int = 12) -> bytes:
        """Random bytes of terminal `name`: a random DFA walk, ending once it may after max_len."""
        dfa, state, out = self._dfas[name], self._dfas[name].start, bytearray()
        while True:
            options = [b for b in range(256)  # no control characters but \t \n \r
                       if dfa.trans[state, dfa.classes[b]] != dfa.dead and (b >= 32 or b in b"\t\n\r")]
            if dfa.final[state] and (not options or len(out) >= max_len or rng.random() < 0.3):
                return bytes(out)
            ascii_options = [b for b in options if 32 <= b < 127 or b in b"\n"]
            b = rng.choice(ascii_options if ascii_options and rng.random() < 0.9 else options)
            out.append(b)
            state = int(dfa.trans[state, dfa.classes[b]])

    def parses(self, text: str) -> bool:
        if self.accept is not None:
            return self.accept(text)
        try:
            self._lark.parse(text)
            return True
        except Exception:  # noqa: BLE001  (any lark error)
            return False

    def sentence(self, rng: random.Random, tries: int = 50) -> str:
        """A random sentence that parses() (ValueError after `tries` rejected attempts)."""
        for attempt in range(tries):
            parts = []
            for term in self.terminals(rng):
                if self._ignore and rng.random() < 0.3 + attempt / 10:
                    parts.append(self.spell(rng, rng.choice(self._ignore), 3))
                parts.append(self.spell(rng, term))
            try:
                text = b"".join(parts).decode()
            except UnicodeDecodeError:
                continue
            if self.parses(text):
                return text
        raise ValueError("no sentence found")
