"""A Lark grammar -> CfgSpec: the internal form of every context-free constraint (Lark EBNF, GBNF,
and later recursive JSON Schemas): its terminals as regexes in outlines-core's dialect plus lark's
LALR(1) parse table as plain dicts (picklable, no lark objects).

Terminal regexes: string literals are escaped (`"x"i` becomes `(?i:x)`); regex terminals go
through regex.prepare_regex (Python-only constructs rejected by name). A regex with a lazy
quantifier (`*?`, `+?`, `??`, `{m,n}?`) is read greedily, and the terminal is marked lazy: its
lexeme ends at its first match (what `re.match` does with `.*?"`; llguidance does the same).
common.lark's ESCAPED_STRING is the one lookbehind idiom rewritten to plain regex.
"""
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.regex import escape_literal, prepare_regex, skeleton

BUILTIN_DIR = Path(__file__).parent
BUILTIN_PREFIX = "builtin:"
END = "$END"
# lark's common.ESCAPED_STRING, after _STRING_ESC_INNER is inlined; `.` excludes only newline.
LARK_ESCAPED_STRING = '".*?(?<!\\\\)(\\\\\\\\)*?"'
PLAIN_ESCAPED_STRING = '"(?:[^"\\\\\\n]|\\\\[^\\n])*"'
LAZY_QUANTIFIER = r"(?:[*+?]|\{[0-9]*,?[0-9]*\})\?"


@dataclass(frozen=True)
class Terminal:
    name: str
    regex: str          # outlines-core dialect, matched in full
    priority: int
    literal: bool       # a string literal (wins a tie against a pattern, like lark's `unless`)
    lazy: bool          # the lexeme ends at its first match


Action = tuple[bool, int | tuple[str, int]]  # (shift?, next state | (rule origin, rule length))


@dataclass(frozen=True)
class CfgSpec:
    """Terminals (index = terminal id), ignored terminal ids, and the LALR(1) table:
    actions[state][symbol] for terminals and nonterminals (gotos are shifts on nonterminals)."""
    source: str
    terminals: tuple[Terminal, ...]
    ignore: frozenset[int]
    actions: tuple[dict[str, Action], ...]
    start_state: int
    end_state: int

    @cached_property
    def terminal_ids(self) -> dict[str, int]:
        return {t.name: i for i, t in enumerate(self.terminals)}


def load_grammar_text(spec: object) -> str:
    """The Lark text of a "grammar" spec: Lark source, GBNF (`root ::= ...`), or "builtin:NAME"."""
    if not isinstance(spec, str) or not spec.strip():
        raise GrammarError("guided_grammar must be a non-empty string (Lark EBNF or GBNF)")
    name = spec.strip()
    if name.startswith(BUILTIN_PREFIX):
        path = BUILTIN_DIR / f"{name[len(BUILTIN_PREFIX):]}.lark"
        if "/" in name or not path.is_file():
            known = ", ".join(sorted(BUILTIN_PREFIX + p.stem for p in BUILTIN_DIR.glob("*.lark")))
            raise GrammarError(f"unknown built-in grammar {name!r}; known: {known}")
        return path.read_text()
    from gdserve.grammar.gbnf import gbnf_to_lark, is_gbnf
    return gbnf_to_lark(spec) if is_gbnf(spec) else spec


def lark_to_spec(text: str) -> CfgSpec:
    """Parse Lark text and build its LALR(1) table; GrammarError with lark's message (line and
    column for syntax errors, the colliding rules for a conflict). Calls lark's grammar loader and
    LALR analyzer directly: `lark.Lark` would also build lexers we never use (its terminal
    collision check alone takes ~0.5 s on json.lark)."""
    from lark.common import ParserConf
    from lark.exceptions import LarkError
    from lark.load_grammar import load_grammar
    from lark.parsers.lalr_analysis import LALR_Analyzer
    _warm_meta_parser()
    try:
        grammar, _ = load_grammar(text, "<grammar>", [_import_lark_stdlib_only], False)
        lark_terminals, rules, ignore = grammar.compile(["start"], set())
        analysis = LALR_Analyzer(ParserConf(rules, {}, ["start"]))
        analysis.compute_lalr()
    except LarkError as e:
        raise GrammarError(f"invalid Lark grammar: {type(e).__name__}: {e}") from None
    terminals = tuple(_terminal(t) for t in lark_terminals)
    names = {t.name: i for i, t in enumerate(terminals)}
    table = analysis.parse_table
    actions = tuple(_actions(table.states[s]) for s in range(len(table.states)))
    return CfgSpec(text, terminals, frozenset(names[str(n)] for n in ignore), actions,
                   table.start_states["start"], table.end_states["start"])


def _import_lark_stdlib_only(base_path, grammar_path: str):
    """lark's %import hook (tried before its own search, which opens files relative to the working
    directory): only lark's bundled grammars (`%import common.NUMBER`), so that a grammar from a
    request never reaches the filesystem."""
    from lark.load_grammar import stdlib_loader
    try:
        return stdlib_loader(base_path, grammar_path)
    except OSError:
        name = grammar_path.removesuffix(".lark").replace("/", ".")
        raise GrammarError(f"invalid Lark grammar: cannot %import '{name}': only lark's own grammars "
                           "(common, unicode) can be imported") from None


def _warm_meta_parser() -> None:
    """lark parses grammars with a parser it builds once per process (~0.9 s), half of it a
    terminal-collision check of its own meta-grammar through interegular: build it without that
    check (the compile workers are single-threaded; the flag is restored at once)."""
    import lark.lexer
    from lark.load_grammar import _get_parser
    if hasattr(_get_parser, "cache"):
        return
    saved, lark.lexer.has_interegular = lark.lexer.has_interegular, False
    try:
        _get_parser()
    finally:
        lark.lexer.has_interegular = saved


def _actions(state: dict) -> dict[str, Action]:
    out = {}
    for symbol, (action, arg) in state.items():  # str(): lark's names are Tokens (slow __eq__)
        if action.name == "Shift":
            out[str(symbol)] = (True, arg)
        else:
            out[str(symbol)] = (False, (str(arg.origin.name), len(arg.expansion)))
    return out


def _terminal(t) -> Terminal:
    pattern = t.pattern
    literal = type(pattern).__name__ == "PatternStr"
    if literal:
        regex, lazy = escape_literal(pattern.value), False
        if "i" in pattern.flags:
            regex = f"(?i:{regex})"
    else:
        regex, lazy = _pattern_regex(t.name, pattern)
    return Terminal(str(t.name), regex, t.priority, literal, lazy)


def _pattern_regex(name: str, pattern) -> tuple[str, bool]:
    raw = pattern.value
    if raw == LARK_ESCAPED_STRING:
        raw = PLAIN_ESCAPED_STRING
    skel = skeleton(raw)
    lazy_at = [m.end() - 1 for m in re.finditer(LAZY_QUANTIFIER, skel)]
    for i in reversed(lazy_at):
        raw = raw[:i] + raw[i + 1:]
    flags = "".join(f for f in sorted(pattern.flags) if f in "imsx")
    regex = f"(?{flags}:{raw})" if flags else raw
    try:
        return prepare_regex(regex), bool(lazy_at)
    except GrammarError as e:
        raise GrammarError(f"terminal {name}: {e}") from None

