"""Regex text for outlines-core: user regexes made ready (or rejected with the reason), and choice
lists made into a literal alternation.

The dialect is outlines-core's, i.e. Rust's regex-syntax: Python's common syntax means the same
there, and the output must match the whole regex (`re.fullmatch`). On top of it:
- a leading `^` / `\\A` and a trailing `$` / `\\Z` / `\\z` are dropped (no-ops under fullmatch);
  anchors anywhere else are rejected;
- Python's `{,n}` is read as `{0,n}`;
- Python constructs that regex-syntax rejects (lookarounds, backreferences, atomic groups,
  conditionals, word boundaries, octal and `\\N{...}` escapes) or reads differently (possessive
  quantifiers: Rust takes `a++` as `(a+)+`) raise GrammarError naming the construct and position.
`\\d`, `\\w`, `\\s` are Unicode-aware, as in Python's `re` on str: `\\d` admits every Unicode
decimal digit (and partial multi-byte tokens on the way). Generated regexes use `[0-9]`. Character classes
follow Rust (`[[:alpha:]]` is a POSIX class, `[a[b]]` a nested class, `&&` an intersection).
"""
import re

from gdserve.grammar.errors import GrammarError

# Searched in the skeleton of a pattern (classes and escaped symbols blanked): they only hit syntax.
UNSUPPORTED = [
    (re.compile(r"\(\?<?[=!]"), "lookaround assertions ((?=...), (?!...), (?<=...), (?<!...))"),
    (re.compile(r"\\[1-9]|\(\?P="), "backreferences"),
    (re.compile(r"\(\?>"), "atomic groups (?>...)"),
    (re.compile(r"\(\?\("), "conditional groups (?(...)...)"),
    (re.compile(r"\(\?#"), "comment groups (?#...)"),
    (re.compile(r"(?:[*+?]|\{[0-9]*,?[0-9]*\})\+"), "possessive quantifiers (*+, ++, ?+, {m,n}+)"),
    (re.compile(r"\\[bB]"), "word boundaries (\\b, \\B)"),
    (re.compile(r"\\0"), "octal escapes (write \\xNN)"),
    (re.compile(r"\\N\{"), "named Unicode escapes \\N{...} (write \\u{NNNN} or the character)"),
    (re.compile(r"[\^$]|\\[AZz]"),
     "anchors other than a leading ^ and a trailing $ (the whole output matches the regex)"),
]
RUST_META = set("\\.+*?()|[]{}^$#&-~")


def _class_end(pattern: str, start: int) -> int:
    """Index just past the character class opening at `start` (nested classes as in Rust)."""
    i = start + 1
    i += pattern.startswith("^", i)
    i += pattern.startswith("]", i)  # a leading ] is a literal
    depth = 1
    while i < len(pattern) and depth:
        if pattern[i] == "\\":
            i += 1
        elif pattern[i] == "[":
            depth += 1
        elif pattern[i] == "]":
            depth -= 1
        i += 1
    return i


def skeleton(pattern: str) -> str:
    """Same length as `pattern`, with each character class and each escaped symbol (`\\+`, `\\$`)
    replaced by `_`: what is left is the syntax outside classes (escapes like `\\1`, `\\b` stay)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            end = _class_end(pattern, i)
            out.append("_" * (end - i))
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append("\\" + nxt if nxt.isalnum() else "__")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _strip_anchors(pattern: str) -> str:
    skel = skeleton(pattern)
    start = 1 if skel.startswith("^") else 2 if skel.startswith("\\A") else 0
    end = len(pattern)
    if skel.endswith("$"):
        end -= 1
    elif skel.endswith(("\\Z", "\\z")):
        end -= 2
    return pattern[start:max(start, end)]


def prepare_regex(pattern: str) -> str:
    """The regex to hand to outlines-core, or GrammarError naming the unsupported construct."""
    if not isinstance(pattern, str):
        raise GrammarError(f"a regex must be a string, got {type(pattern).__name__}")
    pattern = _strip_anchors(pattern)
    skel = skeleton(pattern)
    for construct, what in UNSUPPORTED:
        if m := construct.search(skel):
            raise GrammarError(f"regex {pattern!r}: {what} are not supported "
                               f"(at position {m.start()}: {pattern[m.start():m.end() + 8]!r})")
    _check_groups(pattern, skel)
    for m in reversed(list(re.finditer(r"\{,", skel))):
        pattern = pattern[:m.start()] + "{0," + pattern[m.end():]
    return pattern


def _check_groups(pattern: str, skel: str) -> None:
    """GrammarError for a parenthesis without its partner (the regex is later wrapped in a group,
    where a stray `)` would close that group and change the language instead of failing)."""
    depth = 0
    for i, c in enumerate(skel):
        depth += (c == "(") - (c == ")")
        if depth < 0:
            raise GrammarError(f"cannot compile regex {pattern!r}: unbalanced ')' at position {i}")
    if depth:
        raise GrammarError(f"cannot compile regex {pattern!r}: {depth} '(' not closed")


def explain_index_error(pattern: str, error: Exception) -> GrammarError:
    """outlines-core's error text, plus Python's complaint when it has one (it names a position)."""
    try:
        re.compile(pattern)
        hint = ""
    except re.error as e:
        hint = f" (Python's re: {e})"
    return GrammarError(f"cannot compile regex {pattern!r}: outlines-core: {error}{hint}")


def escape_literal(text: str) -> str:
    """A regex matching exactly `text`: regex-syntax's meta characters escaped, the rest kept."""
    return "".join("\\" + c if c in RUST_META else c for c in text)


def choice_regex(choices: object) -> str:
    """An alternation matching exactly one of `choices` (a non-empty list of strings), literally."""
    if not isinstance(choices, (list, tuple)) or not choices:
        raise GrammarError("guided_choice must be a non-empty list of strings")
    bad = [c for c in choices if not isinstance(c, str)]
    if bad:
        raise GrammarError(f"guided_choice entries must be strings, got {bad[0]!r}")
    return "(" + "|".join(escape_literal(c) for c in choices) + ")"
