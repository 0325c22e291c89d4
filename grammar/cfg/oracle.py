"""A slow exact oracle for CfgGrammar masks (tests and `gdserve bench grammar`), built apart from
the compiled path: lark's own interactive LALR parser (`accepts()`, `feed_token`, `feed_eof`) and
the `regex` module's partial matching on lark's own terminal regexes, with the lexing semantics
of cfg.lexer (maximal munch without backtracking, lazy terminals end at their first match, ties:
priority, then literals, then lark's order).

OracleState is the parser after the emitted terminals plus the text of the unfinished lexeme.
`viable(state, data, eos)` says whether the text extended by `data` is a prefix of the language
(eos: is in it). Text is bytes; a text that ends inside a UTF-8 character cannot be judged
(None), invalid UTF-8 is not viable.
"""
import codecs
from dataclasses import dataclass
from functools import cached_property

import regex

from gdserve.grammar.cfg.lark_spec import LAZY_QUANTIFIER
from gdserve.grammar.regex.syntax import skeleton


@dataclass
class OracleState:
    parser: object   # lark InteractiveParser
    pending: bytes   # the unfinished lexeme's bytes


@dataclass
class LarkOracle:
    text: str

    @cached_property
    def lark(self):
        import lark
        return lark.Lark(self.text, parser="lalr")

    @cached_property
    def _terms(self) -> dict[str, tuple]:
        """name -> (compiled regex, lazy, preference key)."""
        out = {}
        for order, t in enumerate(self.lark.terminals):
            pattern = t.pattern.to_regexp()
            lazy = t.pattern.type == "re" and regex.search(LAZY_QUANTIFIER, skeleton(t.pattern.value))
            out[t.name] = (regex.compile(pattern), bool(lazy),
                           (-t.priority, t.pattern.type != "str", order))
        return out

    def initial(self) -> OracleState:
        return OracleState(self.lark.parse_interactive(""), b"")

    def _alive(self, name: str, text: str) -> bool:
        pattern, lazy, _ = self._terms[name]
        if not pattern.fullmatch(text, partial=True):
            return False
        return not lazy or not any(pattern.fullmatch(text[:k]) for k in range(1, len(text)))

    def _candidates(self, parser) -> list[str]:
        return sorted(set(parser.accepts()) - {"$END"} | set(self.lark.ignore_tokens))

    def advance(self, state: OracleState, data: bytes, eos: bool = False,
                defer: bool = False) -> OracleState | None:
        """The state after `data` (None: not viable); with eos, also the end of the text. A text
        that ends inside a UTF-8 character raises ValueError, or with defer is kept unread."""
        raw = state.pending + data
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            text = decoder.decode(raw)
        except UnicodeDecodeError:
            return None
        if decoder.getstate()[0]:
            if defer:
                return OracleState(state.parser, raw)
            raise ValueError("text ends inside a UTF-8 character")
        parser, pos = state.parser.copy(), 0
        while True:
            names = self._candidates(parser)
            end = pos
            while end < len(text) and any(self._alive(n, text[pos:end + 1]) for n in names):
                end += 1
            if end == len(text) and not eos:
                return OracleState(parser, text[pos:].encode())
            lexeme = text[pos:end]
            if not lexeme:
                return self._finish(parser) if eos and pos == len(text) else None
            done = [n for n in names if self._terms[n][0].fullmatch(lexeme)]
            if not done:
                return None
            name = min(done, key=lambda n: self._terms[n][2])
            if name not in self.lark.ignore_tokens:
                parser = self._feed(parser, name, lexeme)
                if parser is None:
                    return None
            pos = end

    def _feed(self, parser, name: str, value: str):
        from lark import Token
        from lark.exceptions import UnexpectedInput
        try:
            parser.feed_token(Token(name, value))
        except UnexpectedInput:
            return None
        return parser

    def _finish(self, parser) -> OracleState | None:
        from lark.exceptions import UnexpectedInput
        try:
            parser.copy().feed_eof()
        except UnexpectedInput:
            return None
        return OracleState(parser, b"")

    def viable(self, state: OracleState, data: bytes, eos: bool = False) -> bool | None:
        try:
            return self.advance(state, data, eos) is not None
        except ValueError:
            return None


@dataclass
class WalkReport:
    steps: int = 0
    checked: int = 0       # (state, token) pairs judged by the oracle
    unjudged: int = 0      # tokens ending inside a UTF-8 character
    wrong: list = None     # (text so far, token bytes, mask said, oracle said)

    def __post_init__(self):
        self.wrong = []


def oracle_walk(grammar, oracle: LarkOracle, guides: list[list[int]], rng, steps: int,
                sample: int = 30) -> WalkReport:
    """`steps` random steps of a matcher, each mask checked against the oracle on a sample of
    tokens: up to `sample` allowed, `sample` random disallowed, `sample` disallowed that share a
    first byte with an allowed one, and EOS. Steps follow a guide (a valid sentence's token ids)
    most of the time and a random allowed token otherwise; a finished walk starts over."""
    import numpy as np
    from gdserve.grammar import allocate_token_bitmask
    from gdserve.kernels.bitmask import unpack_words
    report, bitmask = WalkReport(), allocate_token_bitmask(1, grammar.vocab_size)
    eos = min(grammar.eos_token_ids)
    real = np.array([t for t in range(grammar.vocab_size) if grammar.token_data(t)])
    first = {}
    for t in real.tolist():
        first.setdefault(grammar.token_data(t)[0], []).append(t)
    matcher = None
    while report.steps < steps:
        if matcher is None:
            matcher, ostate, text = grammar.matcher(), oracle.initial(), b""
            guide, at = rng.choice(guides), 0
        matcher.fill_next_token_bitmask(bitmask, 0)
        allowed = set(np.flatnonzero(unpack_words(bitmask[0].numpy(), grammar.vocab_size)).tolist())
        report.steps += 1
        want = oracle.viable(ostate, b"", eos=True)
        if want is not None and want != (eos in allowed):
            report.wrong.append((text, b"<EOS>", eos in allowed, want))
        report.checked += want is not None
        ok_real = sorted(allowed - grammar.eos_token_ids)
        near = [t for b in {grammar.token_data(t)[0] for t in rng.sample(ok_real, min(5, len(ok_real)))}
                for t in rng.sample(first[b], min(sample // 5, len(first[b])))]
        cands = (rng.sample(ok_real, min(sample, len(ok_real))) + near
                 + rng.sample(real.tolist(), sample))
        for t in set(cands):
            want = oracle.viable(ostate, grammar.token_data(t))
            if want is None:
                report.unjudged += 1
                continue
            report.checked += 1
            if want != (t in allowed):
                report.wrong.append((text, grammar.token_data(t), t in allowed, want))
        if not ok_real:
            matcher = None
            continue
        if at < len(guide) and guide[at] in allowed and rng.random() < 0.85:
            token, at = guide[at], at + 1
        else:
            token, at = rng.choice(ok_real), len(guide)
        assert matcher.accept_token(token)
        text += grammar.token_data(token)
        ostate = oracle.advance(ostate, grammar.token_data(token), defer=True)
        if ostate is None:
            report.wrong.append((text, grammar.token_data(token), True, False))
            matcher = None
        if at >= len(guide) and rng.random() < 0.1:
            matcher = None
    return report
