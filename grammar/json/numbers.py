"""Exact regexes for integer and decimal ranges, in the dialect shared by Python `re` and Rust `regex`.

- `int_range_regex(lo, hi)`: every integer in [lo, hi] (either end may be None = unbounded), written
  the JSON way: no leading zeros, no "+", and never "-0" (zero is written "0").
- `decimal_range_regex(lo, hi, max_frac)`: every decimal in the range written as JSON numbers *without
  an exponent* (`-?int(\\.digits)?`); the ends are `Bound`s (a `Decimal` value, exclusive or not).
  `max_frac` caps the number of fraction digits (None = unbounded).
- `digit_range(lo, hi, width, radix)`: fixed-width digit strings in [lo, hi]; radix 16 renders each
  hex digit case-insensitively (used for `\\uXXXX` escapes).

Sizes are linear in the number of digits of the bounds (a 300-digit bound gives a regex of a few
hundred parts), never in the size of the range.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from math import gcd, lcm

_HEX = "0123456789abcdef"


@dataclass(frozen=True)
class Bound:
    value: Decimal
    exclusive: bool = False


def _alt(parts: list[str]) -> str:
    parts = [p for p in dict.fromkeys(parts)]
    if len(parts) == 1:
        return parts[0]
    return "(?:" + "|".join(parts) + ")"


def _digit_class(lo: int, hi: int, radix: int = 10) -> str:
    """One digit with value in [lo, hi]; hex letters match in both cases."""
    if radix == 10:
        if lo == hi:
            return str(lo)
        return f"[{lo}-{hi}]" if hi > lo + 1 else f"[{lo}{hi}]"
    pieces = []
    d_lo, d_hi = lo, min(hi, 9)
    if d_lo <= d_hi:
        pieces.append(str(d_lo) if d_lo == d_hi else f"{d_lo}-{d_hi}")
    a_lo, a_hi = max(lo, 10), hi
    if a_lo <= a_hi:
        for case in (str.lower, str.upper):
            x, y = case(_HEX[a_lo]), case(_HEX[a_hi])
            pieces.append(x if x == y else f"{x}-{y}")
    if lo == hi and lo <= 9:
        return str(lo)
    return "[" + "".join(pieces) + "]"


def _any_digits(n: int, radix: int = 10) -> str:
    if n <= 0:
        return ""
    cls = _digit_class(0, radix - 1, radix)
    return cls if n == 1 else f"{cls}{{{n}}}"


def _ge(rest: list[int], radix: int) -> str:
    """Digit strings of len(rest) that are >= rest."""
    if all(d == 0 for d in rest):
        return _any_digits(len(rest), radix)
    d, tail = rest[0], rest[1:]
    if all(x == 0 for x in tail):
        return _digit_class(d, radix - 1, radix) + _any_digits(len(tail), radix)
    parts = [_digit_class(d, d, radix) + _ge(tail, radix)]
    if d < radix - 1:
        parts.append(_digit_class(d + 1, radix - 1, radix) + _any_digits(len(tail), radix))
    return _alt(parts)


def _le(rest: list[int], radix: int) -> str:
    """Digit strings of len(rest) that are <= rest."""
    if all(d == radix - 1 for d in rest):
        return _any_digits(len(rest), radix)
    d, tail = rest[0], rest[1:]
    if all(x == radix - 1 for x in tail):
        return _digit_class(0, d, radix) + _any_digits(len(tail), radix)
    parts = []
    if d > 0:
        parts.append(_digit_class(0, d - 1, radix) + _any_digits(len(tail), radix))
    parts.append(_digit_class(d, d, radix) + _le(tail, radix))
    return _alt(parts)


def _same_len(lo: list[int], hi: list[int], radix: int) -> str:
    """Digit strings s with len(s) == len(lo) == len(hi) and lo <= s <= hi."""
    i = 0
    while i < len(lo) and lo[i] == hi[i]:
        i += 1
    prefix = "".join(_digit_class(d, d, radix) for d in lo[:i])
    if i == len(lo):
        return prefix
    a, b = lo[i], hi[i]
    lo_rest, hi_rest = lo[i + 1:], hi[i + 1:]
    lo_full = all(d == 0 for d in lo_rest)
    hi_full = all(d == radix - 1 for d in hi_rest)
    mid_lo = a if lo_full else a + 1
    mid_hi = b if hi_full else b - 1
    parts = []
    if not lo_full:
        parts.append(_digit_class(a, a, radix) + _ge(lo_rest, radix))
    if mid_lo <= mid_hi:
        parts.append(_digit_class(mid_lo, mid_hi, radix) + _any_digits(len(lo_rest), radix))
    if not hi_full:
        parts.append(_digit_class(b, b, radix) + _le(hi_rest, radix))
    return prefix + _alt(parts)


def _digits(n: int, width: int, radix: int) -> list[int]:
    out = []
    for _ in range(width):
        n, r = divmod(n, radix)
        out.append(r)
    return out[::-1]


def digit_range(lo: int, hi: int, width: int, radix: int = 16) -> str:
    """Regex for the fixed-width (zero-padded) digit strings of the numbers in [lo, hi]."""
    if not 0 <= lo <= hi < radix**width:
        raise ValueError(f"bad digit range [{lo}, {hi}] for width {width}")
    return _same_len(_digits(lo, width, radix), _digits(hi, width, radix), radix)


def _nonneg_range(a: int, b: int | None) -> list[str]:
    """Alternatives for the integers in [a, b] (a >= 0), no leading zeros."""
    parts: list[str] = []
    if a == 0:
        if b is not None and b < 0:
            return parts
        parts.append("0")
        a = 1
    if b is not None and a > b:
        return parts
    la = len(str(a))
    lb = None if b is None else len(str(b))
    length = la
    # a partial first length (a is not 10^(la-1))
    if a != 10 ** (la - 1):
        hi = 10**la - 1 if b is None else min(b, 10**la - 1)
        parts.append(_same_len([int(c) for c in str(a)], [int(c) for c in str(hi)], 10))
        length = la + 1
    # full lengths: length .. last full length
    last_full = None if b is None else (lb if b == 10**lb - 1 else lb - 1)
    if last_full is None:
        parts.append(f"[1-9][0-9]{{{length - 1},}}" if length > 1 else "[1-9][0-9]*")
        return parts
    if length <= last_full:
        lo_n, hi_n = length - 1, last_full - 1
        if hi_n == 0:
            parts.append("[1-9]")
        elif lo_n == hi_n:
            parts.append(f"[1-9][0-9]{{{lo_n}}}" if lo_n > 1 else "[1-9][0-9]")
        else:
            parts.append(f"[1-9][0-9]{{{lo_n},{hi_n}}}")
    # a partial last length
    if b is not None and last_full != lb and lb >= length:
        lo = max(a, 10 ** (lb - 1))
        parts.append(_same_len([int(c) for c in str(lo)], [int(c) for c in str(b)], 10))
    return parts


def int_range_regex(lo: int | None, hi: int | None) -> str | None:
    """Regex for the integers in [lo, hi]; None if the range is empty."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts: list[str] = []
    if lo is None or lo < 0:
        # negative numbers: magnitudes in [max(1, -hi), -lo]
        m_lo = 1 if hi is None or hi >= 0 else -hi
        m_hi = None if lo is None else -lo
        neg = _nonneg_range(m_lo, m_hi)
        if neg:
            parts.append("-" + _alt(neg))
    if hi is None or hi >= 0:
        parts.extend(_nonneg_range(max(lo, 0) if lo is not None else 0, hi))
    return _alt(parts) if parts else None


# ---------------------------------------------------------------------------------------------
# Decimals. A fraction is handled as a digit string s (possibly empty = no fraction part), compared
# with a bound's fraction digits d (trailing zeros stripped) as the values 0.s and 0.d.
# Each helper returns (empty_ok, alternatives for non-empty s).


def _frac_digits(lo: int, n: int | None) -> str:
    """lo..n digits (n None: unbounded)."""
    if n is None:
        return "[0-9]*" if lo == 0 else ("[0-9]+" if lo == 1 else f"[0-9]{{{lo},}}")
    if n < lo:
        raise ValueError("bad digit count")
    if n == 0:
        return ""
    if lo == n:
        return "[0-9]" if n == 1 else f"[0-9]{{{n}}}"
    return f"[0-9]{{{lo},{n}}}"


def _dec(n: int | None) -> int | None:
    return None if n is None else n - 1


def _tail(empty_ok: bool, alts: list[str]) -> str | None:
    if not alts:
        return "" if empty_ok else None
    body = _alt(alts)
    return f"(?:{body})?" if empty_ok else body


def _nonzero(n: int | None) -> list[str]:
    """Non-empty digit strings of length <= n that contain a nonzero digit."""
    if n is None:
        return ["0*[1-9][0-9]*"]
    out = ["[1-9]" + _frac_digits(0, n - 1)]
    if n > 1:
        out.append("0" + _alt(_nonzero(n - 1)))
    return out


def _fge(d: str, excl: bool, n: int | None) -> tuple[bool, list[str]]:
    """0.s >= 0.d (or >)."""
    if not d:
        if not excl:
            return True, ([_frac_digits(1, n)] if n != 0 else [])
        return False, (_nonzero(n) if n != 0 else [])
    if n == 0:
        return False, []
    c = int(d[0])
    alts = []
    if c < 9:
        alts.append(_digit_class(c + 1, 9) + _frac_digits(0, _dec(n)))
    t = _tail(*_fge(d[1:], excl, _dec(n)))
    if t is not None:
        alts.append(str(c) + t)
    return False, alts


def _fle(d: str, excl: bool, n: int | None) -> tuple[bool, list[str]]:
    """0.s <= 0.d (or <)."""
    if not d:
        if excl:
            return False, []
        return True, (["0+" if n is None else ("0" if n == 1 else f"0{{1,{n}}}")] if n != 0 else [])
    if n == 0:
        return True, []
    c = int(d[0])
    alts = []
    if c > 0:
        alts.append(_digit_class(0, c - 1) + _frac_digits(0, _dec(n)))
    t = _tail(*_fle(d[1:], excl, _dec(n)))
    if t is not None:
        alts.append(str(c) + t)
    return True, alts


def _fbetween(dl: str, el: bool, dh: str, eh: bool, n: int | None) -> tuple[bool, list[str]]:
    """0.dl <(=) 0.s <(=) 0.dh, where 0.dl <= 0.dh."""
    if not dl and not el:
        return _fle(dh, eh, n)
    if not dl and not dh:
        return False, []  # 0 < s < 0 or similar: nothing (0 <= s <= 0 handled above)
    empty_ok = False  # s empty means 0: needs dl empty and not el (handled above)
    if n == 0:
        return empty_ok, []
    cl = int(dl[0]) if dl else 0
    ch = int(dh[0]) if dh else 0
    rl, rh = dl[1:], dh[1:]
    alts = []
    if cl == ch:
        t = _tail(*_fbetween(rl, el, rh, eh, _dec(n)))
        if t is not None:
            alts.append(str(cl) + t)
        return empty_ok, alts
    t = _tail(*_fge(rl, el, _dec(n)))
    if t is not None:
        alts.append(str(cl) + t)
    if cl + 1 <= ch - 1:
        alts.append(_digit_class(cl + 1, ch - 1) + _frac_digits(0, _dec(n)))
    t = _tail(*_fle(rh, eh, _dec(n)))
    if t is not None:
        alts.append(str(ch) + t)
    return empty_ok, alts


def _fraction(empty_ok: bool, alts: list[str]) -> str | None:
    if not alts:
        return "" if empty_ok else None
    body = "\\." + (_alt(alts) if len(alts) > 1 else alts[0])
    return f"(?:{body})?" if empty_ok else body


def _split(x: Decimal) -> tuple[int, str]:
    """Non-negative decimal -> (integer part, fraction digits without trailing zeros)."""
    sign, digits, exp = x.as_tuple()
    assert not sign or x == 0
    s = "".join(map(str, digits))
    if exp >= 0:
        return int(s + "0" * exp), ""
    if len(s) <= -exp:
        s = "0" * (-exp - len(s) + 1) + s
    ip, fp = s[:exp], s[exp:]
    return int(ip), fp.rstrip("0")


def _pos_decimal(lo: Bound, hi: Bound | None, n: int | None) -> list[str]:
    """Alternatives for decimals x >= 0 with lo <(=) x <(=) hi (lo.value >= 0)."""
    A, fa = _split(lo.value)
    parts = []
    if hi is not None:
        B, fb = _split(hi.value)
        if (A, fa) == (B, fb):
            if lo.exclusive or hi.exclusive:
                return []
            f = _fraction(*_fle(fb, False, n)) if not fb else _fraction(*_fbetween(fa, False, fb, False, n))
            return [] if f is None else [str(A) + f]
        if A == B:
            f = _fraction(*_fbetween(fa, lo.exclusive, fb, hi.exclusive, n))
            return [] if f is None else [str(A) + f]
    f = _fraction(*_fge(fa, lo.exclusive, n))
    if f is not None:
        parts.append(str(A) + f)
    mid = int_range_regex(A + 1, None if hi is None else B - 1)
    if mid is not None:
        any_frac = _fraction(True, [_frac_digits(1, n)] if n != 0 else [])
        parts.append(mid + any_frac)  # int_range_regex never has a top-level "|"
    if hi is not None:
        f = _fraction(*_fle(fb, hi.exclusive, n))
        if f is not None:
            parts.append(str(B) + f)
    return parts


def decimal_range_regex(lo: Bound | None, hi: Bound | None, max_frac: int | None = None) -> str | None:
    """Regex for JSON numbers without exponent whose decimal value lies in the range.

    Zero is never written with a minus sign ("-0", "-0.0" are left out: a sound subset).
    Returns None if the range holds no number.
    """
    return _by_sign(lo, hi, lambda a, b: _pos_decimal(a, b, max_frac))


def _by_sign(lo: Bound | None, hi: Bound | None, side) -> str | None:
    """The range's numbers as "-" and the magnitudes y > 0 in [-hi, -lo], or the numbers x >= 0
    in [lo, hi]: side(lower, upper or None) gives each side's alternatives (lower.value >= 0)."""
    if lo is not None and hi is not None:
        if lo.value > hi.value or (lo.value == hi.value and (lo.exclusive or hi.exclusive)):
            return None
    parts: list[str] = []
    zero = Decimal(0)
    if lo is None or lo.value < 0:
        y_lo = Bound(zero, True) if hi is None or hi.value >= 0 else Bound(-hi.value, hi.exclusive)
        neg = side(y_lo, None if lo is None else Bound(-lo.value, lo.exclusive))
        if neg:
            parts.append("-" + _alt(neg))
    if (hi is None or hi.value >= 0) and not (hi is not None and hi.value == 0 and hi.exclusive):
        parts.extend(side(lo if lo is not None and lo.value >= 0 else Bound(zero), hi))
    return _alt(parts) if parts else None


# ---------------------------------------------------------------------------------------------
# Multiples (multipleOf). step = P / 10^q. x >= 0 is a multiple iff N = x * 10^q is an integer
# divisible by P: x has at most q fraction digits (past them only zeros), and, with P dividing
# 10^m, N's last M = max(m, q) digits decide. So a multiple's integer part is L * 10^(M - q) plus
# the first M - q digits of one of the 10^M / P allowed suffixes, whose last q digits are the
# fraction: any L in a range (int_range_regex) followed by a suffix. Near the range's ends, where
# L is cut, the values are written out one by one.

MULTIPLES_MAX = 1000  # values or suffixes written out, at most


def int_bounds(lo: Bound | None, hi: Bound | None) -> tuple[int | None, int | None]:
    """The least and greatest integers within the bounds (None: unbounded)."""
    a = b = None
    if lo is not None:
        a = int(lo.value.to_integral_value(ROUND_FLOOR)) + 1 if lo.exclusive else int(lo.value.to_integral_value(ROUND_CEILING))
    if hi is not None:
        b = int(hi.value.to_integral_value(ROUND_CEILING)) - 1 if hi.exclusive else int(hi.value.to_integral_value(ROUND_FLOOR))
    return a, b


def multiples_regex(step: Decimal, lo: Bound | None, hi: Bound | None, integer: bool) -> str | None:
    """JSON numbers without exponent in the range that are whole multiples of `step` (> 0); only
    integers when `integer`. None if there is none; ValueError (the reason) where the regex would
    need more than MULTIPLES_MAX parts: a step whose numerator has a prime factor other than 2 and
    5 over a range of more than MULTIPLES_MAX multiples, or one of many digit suffixes (1024)."""
    p, q = _scaled(step)
    if integer:  # integer multiples of step: multiples of p / gcd(p, 10^q)
        p, q = p // gcd(p, 10 ** q), 0
    if p == 1 and integer:
        return int_range_regex(*int_bounds(lo, hi))
    if p == 1 and lo is None and hi is None:  # at most q fraction digits, then zeros
        frac = f"(?:\\.[0-9]{{1,{q}}}0*)?"
        nonzero = f"0\\.[0-9]{{0,{q - 1}}}[1-9]0*"
        return f"(?:-(?:{nonzero}|[1-9][0-9]*{frac})|(?:0|[1-9][0-9]*){frac})"
    step = Decimal(p).scaleb(-q)
    return _by_sign(lo, hi, lambda a, b: _side(step, p, q, a, b, integer))


def common_multiple(steps: list[Decimal]) -> Decimal:
    """The least common multiple of decimal steps (> 0)."""
    q = max(_scaled(step)[1] for step in steps)
    return Decimal(lcm(*(int(step.scaleb(q)) for step in steps))).scaleb(-q)


def _scaled(step: Decimal) -> tuple[int, int]:
    """(p, q) with step = p / 10^q, q the fraction digits of step."""
    q = max(0, -step.normalize().as_tuple().exponent)
    return int(step.scaleb(q)), q


def _side(step: Decimal, p: int, q: int, lo: Bound, hi: Bound | None, integer: bool) -> list[str]:
    """Alternatives for the multiples x >= 0 with lo <(=) x <(=) hi."""
    if hi is not None and _count(step, lo, hi) <= MULTIPLES_MAX:
        return _values(step, lo, hi, integer)
    m = _suffix_digits(p, q)
    unit = Decimal(10) ** (m - q)  # x // unit is L
    first = int(lo.value // unit) + 1
    head = _values(step, lo, Bound(first * unit, True), integer)
    if hi is None:
        return head + _periodic(p, q, m, first, None, integer)
    last = int(hi.value // unit)
    return head + _periodic(p, q, m, first, last - 1, integer) + _values(step, Bound(last * unit), hi, integer)


def _range_of(step: Decimal, lo: Bound, hi: Bound) -> tuple[int, int]:
    first = (lo.value / step).to_integral_value(ROUND_CEILING)
    if lo.exclusive and first * step == lo.value:
        first += 1
    last = (hi.value / step).to_integral_value(ROUND_FLOOR)
    if hi.exclusive and last * step == hi.value:
        last -= 1
    return int(first), int(last)


def _count(step: Decimal, lo: Bound, hi: Bound) -> int:
    first, last = _range_of(step, lo, hi)
    return max(0, last - first + 1)


def _values(step: Decimal, lo: Bound, hi: Bound, integer: bool) -> list[str]:
    first, last = _range_of(step, lo, hi)
    out = []
    for k in range(first, last + 1):
        whole, frac = _split(k * step)
        out.append(str(whole) + _frac_tail(frac, integer))
    return out


def _frac_tail(frac: str, integer: bool) -> str:
    """The fraction after an integer part: its digits (then any zeros), or none or zeros only."""
    if frac:
        return f"\\.{frac}0*"
    return "" if integer else "(?:\\.0+)?"


def _suffix_digits(p: int, q: int) -> int:
    """M: the fewest digits, at least q, whose value mod p a number's last M digits decide."""
    m, rest = 0, p
    for f in (2, 5):
        k = 0
        while rest % f == 0:
            rest, k = rest // f, k + 1
        m = max(m, k)
    if rest != 1:
        raise ValueError(f"more than {MULTIPLES_MAX} multiples of {Decimal(p).scaleb(-q)} in the range, and its "
                         "numerator has a prime factor other than 2 and 5 (only such steps are "
                         "written by their last digits)")
    if 10 ** max(m, q) // p > MULTIPLES_MAX:
        raise ValueError(f"{10 ** max(m, q) // p} digit suffixes (at most {MULTIPLES_MAX})")
    return max(m, q)


def _periodic(p: int, q: int, m: int, first: int, last: int | None, integer: bool) -> list[str]:
    """Multiples whose integer part is L * 10^(m - q) plus a suffix's digits, first <= L <= last."""
    lead = int_range_regex(first, last)
    if lead is None:
        return []
    by_frac: dict[str, list[str]] = {}
    for n in range(0, 10 ** m, p):
        s = str(n).zfill(m)
        by_frac.setdefault(s[m - q:].rstrip("0"), []).append(s[:m - q])
    return [lead + (_alt(ints) if ints != [""] else "") + _frac_tail(frac, integer)
            for frac, ints in by_frac.items()]
