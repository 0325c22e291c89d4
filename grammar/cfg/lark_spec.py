"""A Lark grammar -> CfgSpec: the internal form of every context-free constraint (Lark EBNF, GBNF,
and JSON Schemas on the grammar path, which build theirs from rules directly): its terminals as
regexes in outlines-core's dialect plus the LALR(1) parse table (grammar/cfg/lalr.py) as plain dicts
(picklable, no lark objects). lark parses the grammar text and expands its EBNF into rules.

Terminal regexes: string literals are escaped (`"x"i` becomes `(?i:x)`); regex terminals go
through regex.syntax.prepare_regex (Python-only constructs rejected by name). A regex with a lazy
quantifier (`*?`, `+?`, `??`, `{m,n}?`) is read greedily, and the terminal is marked lazy: its
lexeme ends at its first match (what `re.match` does with `.*?"`; llguidance does the same).
common.lark's ESCAPED_STRING is the one lookbehind idiom rewritten to plain regex.
"""
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.cfg.lalr import Action, Rule, lalr_table
from gdserve.grammar.regex.syntax import escape_literal, prepare_regex, skeleton

BUILTIN_DIR = Path(__file__).parent
BUILTIN_PREFIX = "builtin:"
# lark's common.ESCAPED_STRING, after _STRING_ESC_INNER is inlined; `.` excludes only newline.
LARK_ESCAPED_STRING = '".*?(?<!\\\\)(\\\\\\\\)*?"'
PLAIN_ESCAPED_STRING = '"(?:[^"\\\\\\n]|\\\\[^\\n])*"'
TERMINAL_PRIORITY = 0  # lark's default
LAZY_QUANTIFIER = r"(?:[*+?]|\{[0-9]*,?[0-9]*\})\?"
SELF = "\x00self"  # a rule's reference to itself, when rules are compared


@dataclass(frozen=True)
class Terminal:
    name: str
    regex: str          # outlines-core dialect, matched in full
    priority: int
    literal: bool       # a string literal (wins a tie against a pattern, like lark's `unless`)
    lazy: bool          # the lexeme ends at its first match


@dataclass(frozen=True)
class CfgSpec:
    """Terminals (index = terminal id), ignored terminal ids, and the LALR(1) table:
    actions[state][symbol] for terminals and nonterminals (gotos are shifts on nonterminals).
    exact: the matcher's language is the grammar's, every way of reading the text followed: a
    lexeme may end at any complete match (grammar/cfg/lexer.py), and at a conflict every action
    in `conflicts` is taken (cfg.parser); else lark's ways: maximal munch, conflicts resolved."""
    terminals: tuple[Terminal, ...]
    ignore: frozenset[int]
    actions: tuple[dict[str, Action], ...]
    start_state: int
    end_state: int
    exact: bool = False
    conflicts: dict[tuple[int, str], tuple[Action, ...]] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()  # the BNF the table was built from (start rule `start`)

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
    from gdserve.grammar.cfg.gbnf import gbnf_to_lark, is_gbnf
    return gbnf_to_lark(spec) if is_gbnf(spec) else spec


def lark_to_spec(text: str) -> CfgSpec:
    """Parse Lark text and build its LALR(1) table; GrammarError with lark's message (line and
    column for syntax errors) or the colliding rules of a conflict. Calls lark's grammar loader
    directly: `lark.Lark` would also build lexers we never use (its terminal collision check
    alone takes ~0.5 s on json.lark)."""
    from lark.exceptions import LarkError
    from lark.load_grammar import load_grammar
    _warm_meta_parser()
    try:
        grammar, _ = load_grammar(text, "<grammar>", [_import_lark_stdlib_only], False)
        lark_terminals, lark_rules, ignore = grammar.compile(["start"], set())
    except LarkError as e:
        raise GrammarError(f"invalid Lark grammar: {type(e).__name__}: {e}") from None
    rules = [Rule(str(r.origin.name), tuple(str(s.name) for s in r.expansion), r.options.priority or 0)
             for r in lark_rules]
    return bnf_to_spec(rules, tuple(_terminal(t) for t in lark_terminals), tuple(str(n) for n in ignore))


def bnf_to_spec(rules: list[Rule], terminals: tuple[Terminal, ...], ignore: tuple[str, ...] = (),
                exact: bool = False) -> CfgSpec:
    """The CfgSpec of BNF rules (start rule `start`) over named terminals. Rules the start rule
    never reaches are dropped, and terminals that no rule left uses but for the ignored, as lark
    drops them. Equivalent rules are merged first (_merge_equivalent)."""
    rules = _merge_equivalent(_reachable(rules, "start"))
    table = lalr_table(rules, {t.name for t in terminals}, keep_conflicts=exact)
    used = {s for r in rules for s in r.expansion} | set(ignore)
    terminals = tuple(t for t in terminals if t.name in used)
    names = {t.name: i for i, t in enumerate(terminals)}
    return CfgSpec(terminals, frozenset(names[n] for n in ignore), table.actions,
                   table.start_state, table.end_state, exact, table.conflicts, tuple(rules))


def _merge_equivalent(rules: list[Rule]) -> list[Rule]:
    """Rules with the same alternatives (a rule's references to itself compared as one symbol) are
    one rule, repeated until none are left: the same language, without the reduce/reduce conflicts
    between copies (two anyOf branches whose $ref cycles compile alike, helper rules for equal
    parts). `start` keeps its name. Linear per round (partition refinement, which also merges
    mutually recursive copies, took rounds as many as a rule chain is long)."""
    while True:
        by_origin: dict[str, list[Rule]] = {}
        for r in rules:
            by_origin.setdefault(r.origin, []).append(r)
        first: dict[tuple, str] = {}
        rename: dict[str, str] = {}
        for name in sorted(by_origin, key=lambda n: n != "start"):
            signature = tuple(sorted((r.priority, tuple(SELF if s == name else s for s in r.expansion))
                                     for r in by_origin[name]))
            keep = first.setdefault(signature, name)
            if keep != name:
                rename[name] = keep
        if not rename:
            return rules
        rules = list(dict.fromkeys(Rule(r.origin, tuple(rename.get(s, s) for s in r.expansion), r.priority)
                                   for r in rules if r.origin not in rename))


def _reachable(rules: list[Rule], start: str) -> list[Rule]:
    by_origin: dict[str, list[Rule]] = {}
    for r in rules:
        by_origin.setdefault(r.origin, []).append(r)
    seen, todo = {start}, [start]
    while todo:
        for r in by_origin.get(todo.pop(), ()):
            for s in r.expansion:
                if s in by_origin and s not in seen:
                    seen.add(s)
                    todo.append(s)
    return [r for r in rules if r.origin in seen]


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

