"""JSON string contents as regexes: character sets and their JSON encodings.

Everything here works on *decoded* characters and emits regexes over the *JSON-encoded* text:
one decoded character becomes every encoding we accept for it,

- a literal character (anything but `"`, `\\`, U+0000..U+001F),
- a short escape (`\\"`, `\\\\`, `\\/`, `\\b`, `\\f`, `\\n`, `\\r`, `\\t`),
- `\\uXXXX` (hex in either case) for control characters and non-ASCII BMP characters (for any
  character when the set is "every character"), and a surrogate pair `\\uD83D\\uDE00` (one
  character) for astral ones, except inside bounded repetitions (`pairs=False`: fewer DFA states).

Lone surrogates are never accepted, nor `\\u` spellings of printable ASCII for a proper subset of
characters. So a JSON string matched by `encode_charset(S)` decodes to exactly one character of S
(the basis for exact `minLength`/`maxLength` and for excluding declared property names), and
lengths count decoded characters, as JSON Schema does.

The \\d, \\w, \\s tables here hold both the ECMA-262 meaning and Python `re`'s (what `jsonschema`
evaluates); json.patterns uses them to translate `pattern`s soundly under both.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.numbers import digit_range

MAX_CP = 0x10FFFF
Intervals = tuple[tuple[int, int], ...]

ALL: Intervals = ((0, MAX_CP),)
EMPTY: Intervals = ()


# ---------------------------------------------------------------------------------------------
# Interval sets of code points


def normalize(ivs) -> Intervals:
    out: list[list[int]] = []
    for lo, hi in sorted(ivs):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def union(*sets: Intervals) -> Intervals:
    return normalize([iv for s in sets for iv in s])


def complement(s: Intervals) -> Intervals:
    out, prev = [], 0
    for lo, hi in normalize(s):
        if lo > prev:
            out.append((prev, lo - 1))
        prev = hi + 1
    if prev <= MAX_CP:
        out.append((prev, MAX_CP))
    return tuple(out)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    return complement(union(complement(a), complement(b)))


def chars(*cs: str) -> Intervals:
    return normalize([(ord(c), ord(c)) for c in cs])


def crange(a: str, b: str) -> Intervals:
    return ((ord(a), ord(b)),)


def contains(s: Intervals, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in s)


@functools.cache
def _python_classes() -> tuple[Intervals, Intervals, Intervals]:
    """What Python `re` matches with \\d, \\w, \\s on str (jsonschema evaluates patterns with re)."""
    import re

    text = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, MAX_CP + 1)))

    def cp(i: int) -> int:
        return i if i < 0xD800 else i + 0x800

    out = []
    for rx in (r"\d+", r"\w+", r"\s+"):
        out.append(normalize([(cp(m.start()), cp(m.end() - 1)) for m in re.finditer(rx, text)]))
    return out[0], out[1], out[2]


ECMA_DIGIT = crange("0", "9")
ECMA_WORD = union(crange("a", "z"), crange("A", "Z"), ECMA_DIGIT, chars("_"))
ECMA_SPACE = normalize([(9, 13), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                        (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
                        (0xFEFF, 0xFEFF)])
LINE_TERMINATORS = chars("\n", "\r", "\u2028", "\u2029")


def _shorthand(letter: str) -> tuple[Intervals, Intervals]:
    """(sub, sup) for \\d \\w \\s \\D \\W \\S: sub is matched by both engines, sup by either."""
    lower = letter.lower()
    ecma = {"d": ECMA_DIGIT, "w": ECMA_WORD, "s": ECMA_SPACE}[lower]
    if lower == "s":
        py = _python_classes()[2]
        pos_sub, pos_sup = intersect(ecma, py), union(ecma, py)
    else:
        # ECMA's [0-9] / [A-Za-z0-9_] are inside Python's Unicode \d / \w
        py = _python_classes()[0 if lower == "d" else 1]
        pos_sub, pos_sup = ecma, union(ecma, py)
    if letter.islower():
        return pos_sub, pos_sup
    return complement(pos_sup), complement(pos_sub)


# ---------------------------------------------------------------------------------------------
# Rendering a set of decoded characters as the regex of its JSON encodings

_SHORT = {0x22: '"', 0x5C: "\\", 0x2F: "/", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_SURROGATES: Intervals = ((0xD800, 0xDFFF),)
_LITERAL_OK = complement(union(((0, 0x1F),), chars('"', "\\"), _SURROGATES))
_META = set("\\.^$*+?{}[]()|")


def _class_char(cp: int) -> str:
    if cp < 0x80:
        c = chr(cp)
        return c if c.isalnum() else f"\\x{cp:02x}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def lit(c: str) -> str:
    """One literal character, escaped for both regex dialects (outside a class)."""
    cp = ord(c)
    if c in _META:
        return "\\" + c
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    return c


def render_class(s: Intervals) -> str:
    """A regex matching one code point of s (s non-empty, no surrogates)."""
    if len(s) == 1 and s[0][0] == s[0][1]:
        return lit(chr(s[0][0]))
    comp = [iv for iv in intersect(complement(s), complement(_SURROGATES))]
    if len(comp) < len(s):
        body = "".join(_class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}" for a, b in comp)
        return f"[^{body}]"
    body = "".join(_class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}" for a, b in s)
    return f"[{body}]"


def _hex4(lo: int, hi: int) -> str:
    return digit_range(lo, hi, 4, 16)


def _surrogate_pairs(lo: int, hi: int) -> list[str]:
    def split(cp):
        v = cp - 0x10000
        return 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)

    (ha, la), (hb, lb) = split(lo), split(hi)
    u = "\\\\u"
    if la == 0xDC00 and lb == 0xDFFF:
        return [f"{u}{_hex4(ha, hb)}{u}{_hex4(0xDC00, 0xDFFF)}"]
    if ha == hb:
        return [f"{u}{_hex4(ha, ha)}{u}{_hex4(la, lb)}"]
    out = [f"{u}{_hex4(ha, ha)}{u}{_hex4(la, 0xDFFF)}"]
    if ha + 1 <= hb - 1:
        out.append(f"{u}{_hex4(ha + 1, hb - 1)}{u}{_hex4(0xDC00, 0xDFFF)}")
    out.append(f"{u}{_hex4(hb, hb)}{u}{_hex4(0xDC00, lb)}")
    return out


_MAX_ESCAPE_INTERVALS = 12
_MAX_PAIR_INTERVALS = 4
_U_NONSURROGATE = r"\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})"
_U_PAIR = r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
_LITERAL_ALL = r"[^\x00-\x1f\x22\x5c]"
_SHORT_ALL = r"\\[btnfr\x22\x2f\x5c]"


@functools.lru_cache(maxsize=4096)
def encode_charset(s: Intervals, pairs: bool = True) -> str | None:
    """Regex for one JSON-encoded character of s; None if s is empty.

    pairs=False leaves out surrogate-pair escapes of astral characters (fewer DFA states inside
    bounded repetitions; astral characters are still accepted as literal UTF-8)."""
    s = intersect(s, complement(_SURROGATES))
    if not s:
        return None
    if s == intersect(ALL, complement(_SURROGATES)):
        # every character: any non-surrogate \u escape decodes to exactly one of them
        alts = [_LITERAL_ALL, _SHORT_ALL, _U_NONSURROGATE] + ([_U_PAIR] if pairs else [])
        return "(?:" + "|".join(alts) + ")"
    alts = []
    literal = intersect(s, _LITERAL_OK)
    if literal:
        alts.append(render_class(literal))
    short = [_SHORT[cp] for cp in sorted(_SHORT) if contains(s, cp)]
    if short:
        body = "".join(_class_char(ord(c)) for c in short)
        alts.append("\\\\" + (body if len(short) == 1 else f"[{body}]"))
    escaped = list(intersect(s, ((0, 0x1F),)))
    bmp = intersect(s, ((0x80, 0xFFFF),))
    if len(bmp) <= _MAX_ESCAPE_INTERVALS:
        escaped += list(bmp)
    if escaped:
        hexes = [_hex4(a, b) for a, b in normalize(escaped)]
        alts.append("\\\\u" + (hexes[0] if len(hexes) == 1 else "(?:" + "|".join(hexes) + ")"))
    astral = intersect(s, ((0x10000, MAX_CP),))
    if pairs and astral and len(astral) <= _MAX_PAIR_INTERVALS:
        for a, b in astral:
            alts.extend(_surrogate_pairs(a, b))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def encodes_each(s: Intervals) -> bool:
    """Whether encode_charset spells every subset of s as the union of its characters' own
    encodings (it leaves out escapes of a set with many non-ASCII intervals)."""
    def count(part: Intervals) -> int:
        return sum(b - a + 1 for a, b in intersect(s, part))
    return count(((0x80, 0xFFFF),)) <= _MAX_ESCAPE_INTERVALS and count(((0x10000, MAX_CP),)) <= _MAX_PAIR_INTERVALS


CHAR = encode_charset(ALL)
CHAR_BOUNDED = encode_charset(ALL, pairs=False)


def encode_char(c: str) -> str:
    """Regex for the JSON encodings of one character: literal (or short escape) and \\u forms."""
    return encode_charset(((ord(c), ord(c)),))


def string_literal(value: str) -> str:
    """Regex for the JSON string literal of `value` (escapes accepted where JSON allows them).
    GrammarError for a lone surrogate, which no generated text holds (see the module docstring)."""
    out = []
    for c in value:
        cp = ord(c)
        if 0x20 <= cp < 0x7F and c not in '"\\/':
            out.append(lit(c))
        elif 0xD800 <= cp <= 0xDFFF:
            raise GrammarError(f"string {json.dumps(value)} holds a lone surrogate (U+{cp:04X}), which "
                               "gdserve never generates: remove it from the schema")
        else:
            out.append(encode_char(c))
    return '"' + "".join(out) + '"'


@dataclass
class Limits:
    """Repetition limits (see json.schema): upper bounds above `cap` are lowered to it (recorded in
    `narrowed`, naming the `keywords` the bound comes from), lower bounds above `max_min` are an
    error."""

    cap: int = 256
    max_min: int = 1000
    keywords: str = "repetition"


def _is_atom(x: str) -> bool:
    """True if x can take a quantifier without a group (conservative)."""
    if len(x) == 1 and x not in _META:
        return True
    if len(x) == 2 and x[0] == "\\":
        return True
    if len(x) == 4 and x.startswith("\\x"):
        return True
    # a character class as render_class writes it: no raw brackets inside
    return x.startswith("[") and x.endswith("]") and "[" not in x[1:-1] and "]" not in x[1:-1]


def repeat(x: str, lo: int, hi: int | None, limits: Limits, narrowed: list[str], where: str) -> str:
    """x{lo,hi} with the size limits applied (narrowed upper bounds are recorded)."""
    if lo > limits.max_min:
        raise GrammarError(f"minimum repetition {lo} at {where} exceeds the supported {limits.max_min}")
    if hi is not None and hi > max(lo, limits.cap):
        narrowed.append(f"at {where}: {limits.keywords} bound {hi} lowered to {max(lo, limits.cap)}")
        hi = max(lo, limits.cap)
    a = x if _is_atom(x) else f"(?:{x})"
    if hi is None:
        return a + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
    if hi == 0:
        return ""
    if lo == hi:
        return x if lo == 1 else a + f"{{{lo}}}"
    if (lo, hi) == (0, 1):
        return a + "?"
    return a + f"{{{lo},{hi}}}"
