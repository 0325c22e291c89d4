"""Exact integer / decimal range regexes (gdserve.grammar.json.numbers)."""

import random
import re
from decimal import Decimal

import pytest

from gdserve.grammar.json.numbers import Bound, decimal_range_regex, digit_range, int_range_regex, multiples_regex

WINDOW = range(-1200, 1201)
ENDS = [None, -1200, -1000, -999, -100, -99, -57, -10, -9, -1, 0, 1, 7, 9, 10, 11, 18, 19, 99, 100,
        101, 130, 199, 200, 999, 1000, 1001, 1200]


def _window_strings():
    return [(x, str(x)) for x in WINDOW]


def test_int_range_exhaustive_over_window():
    """Every (lo, hi) pair from ENDS: the regex accepts exactly the integers of the range."""
    strings = _window_strings()
    for lo in ENDS:
        for hi in ENDS:
            rx = int_range_regex(lo, hi)
            if lo is not None and hi is not None and lo > hi:
                assert rx is None
                continue
            c = re.compile(rx)
            for x, s in strings:
                expect = (lo is None or x >= lo) and (hi is None or x <= hi)
                assert (c.fullmatch(s) is not None) == expect, (lo, hi, s, rx)


def test_int_range_random_pairs():
    rng = random.Random(7)
    strings = _window_strings()
    for _ in range(150):
        lo, hi = sorted(rng.randint(-1200, 1200) for _ in range(2))
        c = re.compile(int_range_regex(lo, hi))
        for x, s in strings:
            assert (c.fullmatch(s) is not None) == (lo <= x <= hi), (lo, hi, s)


def test_int_range_rejects_non_canonical_forms():
    c = re.compile(int_range_regex(-50, 50))
    for s in ["-0", "00", "01", "+1", "1.0", "1e1", " 1", "", "-", "--1"]:
        assert not c.fullmatch(s), s
    assert re.fullmatch(int_range_regex(None, None), "0")
    assert not re.fullmatch(int_range_regex(None, None), "-0")


def test_int_range_one_sided_and_big_numbers():
    nonneg = re.compile(int_range_regex(0, None))
    for s in ["0", "7", "10", "123456789012345678901234567890"]:
        assert nonneg.fullmatch(s)
    for s in ["-1", "-123456789012345678901234567890", "01"]:
        assert not nonneg.fullmatch(s)
    big_lo, big_hi = 10**20 + 17, 10**25 - 3
    c = re.compile(int_range_regex(big_lo, big_hi))
    for x in [big_lo, big_lo + 1, 10**21, 10**24 + 5, big_hi, 99999999999999999999999 * 10 + 9]:
        assert (c.fullmatch(str(x)) is not None) == (big_lo <= x <= big_hi), x
    for x in [big_lo - 1, big_hi + 1, 10**25, 10**20]:
        assert not c.fullmatch(str(x)), x
    neg = re.compile(int_range_regex(-(10**30), -(10**29) + 1))
    assert neg.fullmatch(str(-(10**29) - 5)) and not neg.fullmatch(str(-(10**29) + 2))
    assert not neg.fullmatch(str(-(10**30) - 1))
    # the regex stays small for huge ranges
    assert len(int_range_regex(-(10**300), 10**300)) < 4000


def test_digit_range_hex_case_insensitive():
    c = re.compile(digit_range(0x00A0, 0xD7FF, 4, 16))
    for x in list(range(0, 0x10000, 97)) + [0x9F, 0xA0, 0xD7FF, 0xD800]:
        for s in (f"{x:04x}", f"{x:04X}"):
            assert (c.fullmatch(s) is not None) == (0xA0 <= x <= 0xD7FF), s


def _dec_values():
    """Decimal strings in [-13, 13] with up to 3 fraction digits (a sparse but varied grid)."""
    out = []
    rng = random.Random(3)
    for i in range(-13, 14):
        out.append(str(i))
        for _ in range(12):
            f = rng.choice(["0", "5", "25", "125", "999", "001", "1", "75", "50", "000"])
            out.append(f"{i}.{f}" if i != 0 or rng.random() < 0.5 else f"0.{f}")
            if i == 0:
                out.append(f"-0.{f}")
    return out


DEC_ENDS = [None, "-12.5", "-10", "-1", "-0.75", "0", "0.25", "0.5", "1", "2", "2.125", "10", "12.5"]


@pytest.mark.parametrize("lo_ex", [False, True])
@pytest.mark.parametrize("hi_ex", [False, True])
def test_decimal_range_grid(lo_ex, hi_ex):
    values = _dec_values()
    for lo in DEC_ENDS:
        for hi in DEC_ENDS:
            lb = None if lo is None else Bound(Decimal(lo), lo_ex)
            hb = None if hi is None else Bound(Decimal(hi), hi_ex)
            rx = decimal_range_regex(lb, hb)
            if rx is None:
                for s in values:
                    d = Decimal(s)
                    ok = (lb is None or (d > lb.value if lo_ex else d >= lb.value)) and \
                         (hb is None or (d < hb.value if hi_ex else d <= hb.value))
                    assert not ok, (lo, hi, s)
                continue
            c = re.compile(rx)
            for s in values:
                d = Decimal(s)
                ok = (lb is None or (d > lb.value if lo_ex else d >= lb.value)) and \
                     (hb is None or (d < hb.value if hi_ex else d <= hb.value))
                if s.startswith("-") and d == 0:
                    ok = False  # "-0.x" zero is never written with a minus
                assert (c.fullmatch(s) is not None) == ok, (lo, lo_ex, hi, hi_ex, s, rx)


def test_decimal_range_zero_to_one():
    c = re.compile(decimal_range_regex(Bound(Decimal(0)), Bound(Decimal(1))))
    for s in ["0", "0.0", "0.5", "0.999999", "1", "1.0", "1.000"]:
        assert c.fullmatch(s), s
    for s in ["1.0001", "-0.1", "2", "01", "0.", ".5", "1e0", "-0", "-0.0"]:
        assert not c.fullmatch(s), s


def test_decimal_fraction_cap():
    c = re.compile(decimal_range_regex(Bound(Decimal(0), True), Bound(Decimal(1), True), 3))
    assert c.fullmatch("0.999") and c.fullmatch("0.001")
    assert not c.fullmatch("0.9999") and not c.fullmatch("0.0001") and not c.fullmatch("0")
    assert not c.fullmatch("0.000")


def _number_texts() -> list[str]:
    """Integers in a window and beyond, each with and without fractions of up to three digits
    (trailing zeros included), and both signs."""
    rng = random.Random(5)
    out = []
    for whole in list(range(0, 130)) + rng.sample(range(130, 40000), 300):
        out.append(str(whole))
        for frac in ("0", "00", "5", "50", "25", "250", "75", "1", "125", "2", "04", "48", "001", "333"):
            out.append(f"{whole}.{frac}")
    return out + ["-" + t for t in out]


MULTIPLE_CASES = [  # step, lo, hi, integer
    ("16", -2032, 2031, True), ("16", None, None, True), ("16", 0, None, True), ("0.25", 0, 100, False),
    ("0.25", None, None, False), ("0.1", None, None, False), ("0.01", -5, None, False), ("2.5", 3, None, False),
    ("2.5", None, 33000, False), ("0.125", 1, 20000, False), ("5", None, None, False), ("0.5", None, None, True),
    ("7", -700, 5000, True), ("1.5", 0, 300, False), ("20", 15, 30000, True), ("0.75", -150, -2, False), ("0.5", None, -2, False),
]


@pytest.mark.parametrize("step,lo,hi,integer", MULTIPLE_CASES)
@pytest.mark.parametrize("exclusive", [False, True])
def test_multiples_match_exactly_the_multiples_in_range(step, lo, hi, integer, exclusive):
    step = Decimal(step)
    lo_b = None if lo is None else Bound(Decimal(lo), exclusive)
    hi_b = None if hi is None else Bound(Decimal(hi), exclusive)
    c = re.compile(multiples_regex(step, lo_b, hi_b, integer))
    for text in _number_texts():
        x = Decimal(text)
        want = ((x / step) == (x / step).to_integral_value() and (not integer or "." not in text)
                and not (text.startswith("-") and x == 0)  # never "-0" (json.numbers: a sound subset)
                and (lo_b is None or x > lo_b.value or (x == lo_b.value and not exclusive))
                and (hi_b is None or x < hi_b.value or (x == hi_b.value and not exclusive)))
        assert bool(c.fullmatch(text)) == want, (text, step, lo, hi)


def test_multiples_refused_where_the_regex_would_be_huge():
    with pytest.raises(ValueError, match="prime factor other than 2 and 5"):
        multiples_regex(Decimal(7), None, None, True)
    with pytest.raises(ValueError, match="prime factor other than 2 and 5"):
        multiples_regex(Decimal("1.5"), Bound(Decimal(0)), None, False)
    with pytest.raises(ValueError, match="digit suffixes"):
        multiples_regex(Decimal(1024), None, None, True)
    assert multiples_regex(Decimal(2), Bound(Decimal(3)), Bound(Decimal(3)), True) is None
