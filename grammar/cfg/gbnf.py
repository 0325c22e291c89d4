"""GBNF (llama.cpp's `root ::= ...` grammars) -> Lark text, so both dialects share one internal form
(lark_spec.CfgSpec).

GBNF is character-level; Lark lexes. The conversion: each rule becomes a Lark rule (`root` is
`start`, names get a `g_` prefix, `-` becomes `_`), string literals become Lark strings, character
classes and `.` become one-character regex terminals, `{m,n}` becomes `~ m..n`. A rule that is
regular (no recursion, only literals, classes and other regular rules) and cannot match the empty
string becomes one terminal instead, so `string ::= "\"" [^"]* "\""` is lexed as one lexeme.
The result must be LALR(1) like any Lark grammar; GrammarError otherwise.
"""
import json
import re

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.regex.syntax import RUST_META

RULE_START = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_-]*)\s*::=", re.M)
TOKEN = re.compile(r'''\s+|\#[^\n]*|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z][A-Za-z0-9_-]*
                      |\{\s*\d*\s*(?:,\s*\d*\s*)?\}|[()|*+?.]''', re.X | re.S)


def is_gbnf(text: str) -> bool:
    return bool(re.search(r"^\s*root\s*::=", text, re.M))


def _tokens(body: str) -> list[str]:
    out, pos = [], 0
    while pos < len(body):
        m = TOKEN.match(body, pos)
        if not m:
            raise GrammarError(f"GBNF: cannot read {body[pos:pos + 20]!r}")
        if not m.group().isspace() and not m.group().startswith("#"):
            out.append(m.group())
        pos = m.end()
    return out


def _literal(token: str) -> str:
    text = token[1:-1]
    text = re.sub(r"\\x([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)
    text = re.sub(r"\\u([0-9A-Fa-f]{4})", lambda m: chr(int(m.group(1), 16)), text)
    text = re.sub(r"\\U([0-9A-Fa-f]{8})", lambda m: chr(int(m.group(1), 16)), text)
    text = re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)),
                  text)
    return text


def _name(rule: str) -> str:
    return "start" if rule == "root" else "g_" + rule.lower().replace("-", "_")


def _rules(text: str) -> dict[str, list[str]]:
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    starts = list(RULE_START.finditer(text))
    if not starts:
        raise GrammarError("GBNF: no `name ::= ...` rule")
    rules = {}
    for m, nxt in zip(starts, starts[1:] + [None]):
        rules[m.group(1)] = _tokens(text[m.end():nxt.start() if nxt else len(text)])
    return rules


def _escape(text: str) -> str:
    """A regex for `text` that Python's re (lark) and regex-syntax (outlines-core) both read."""
    return "".join("\\" + c if c in RUST_META else f"\\x{ord(c):02x}" if ord(c) < 32 else c
                   for c in text)


def _regex_of(token: str) -> str:
    if token.startswith('"'):
        return _escape(_literal(token))
    if token == ".":
        return "(?s:.)"
    return token


class _Converter:
    def __init__(self, rules: dict[str, list[str]]):
        self.rules = rules
        self.regular: dict[str, str | None] = {}

    def regex(self, name: str, visiting: frozenset = frozenset()) -> str | None:
        """The rule as one regex, or None if it is not regular (recursive)."""
        if name in self.regular:
            return self.regular[name]
        if name in visiting:
            return None
        parts = []
        for tok in self.rules[name]:
            if tok[0].isalpha():
                if tok not in self.rules:
                    raise GrammarError(f"GBNF: rule {name!r} uses undefined rule {tok!r}")
                sub = self.regex(tok, visiting | {name})
                if sub is None:
                    self.regular[name] = None
                    return None
                parts.append(f"(?:{sub})")
            elif tok[0] in '"[.':
                parts.append(_regex_of(tok))
            else:
                parts.append(tok.replace(" ", ""))
        self.regular[name] = "".join(parts)
        return self.regular[name]

    def terminal_name(self, name: str) -> str | None:
        regex = self.regex(name)
        if regex is None or re.fullmatch(regex, ""):
            return None
        return "G_" + name.upper().replace("-", "_")

    def element(self, tok: str) -> str:
        if tok[0].isalpha():
            return self.terminal_name(tok) or _name(tok)
        if tok.startswith('"'):
            return json.dumps(_literal(tok), ensure_ascii=False)
        if tok.startswith("["):
            return "/" + tok.replace("/", "\\/") + "/"
        if tok == ".":
            return "/./s"
        if tok.startswith("{"):
            lo, _, hi = tok[1:-1].replace(" ", "").partition(",")
            lo = lo or "0"
            if not _:
                return f" ~ {lo}"
            return f" ~ {lo}..{hi}" if hi else f" ~ {lo}..{int(lo) + 64}"
        return tok

    def lark(self) -> str:
        if "root" not in self.rules:
            raise GrammarError("GBNF: no `root ::=` rule")
        lines = []
        for name, body in self.rules.items():
            term = self.terminal_name(name)
            if term:
                lines.append(f"{term}: /{self.regex(name).replace('/', chr(92) + '/')}/")
            if name == "root" and term:
                lines.append(f"start: {term}")
            elif not term:
                lines.append(f"{_name(name)}: " + " ".join(self.element(t) for t in body))
        return "\n".join(lines) + "\n"


def gbnf_to_lark(text: str) -> str:
    """Lark text with the same language as the GBNF grammar (see the module docstring)."""
    return _Converter(_rules(text)).lark()
