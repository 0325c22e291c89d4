"""JSON string contents: encodings, lengths, ECMA pattern translation, formats."""

import ipaddress
import json
import random
import re
import uuid

import pytest

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.formats import FORMATS
from gdserve.grammar.json.schema import schema_to_regex
from gdserve.grammar.json.schema_cfg import schema_to_grammar


def rx_for(schema):
    return re.compile(schema_to_regex(schema)[0])


def test_plain_string_escapes():
    rx = rx_for({"type": "string"})
    for s in ["", "plain", 'quote " inside', "back\\slash", "ctl \x01 \x1f", "tab\tnl\n", "é日本😀", "/"]:
        assert rx.fullmatch(json.dumps(s)), s
        assert rx.fullmatch(json.dumps(s, ensure_ascii=False)), s
    for t in ['"\\/"', '"\\u00e9"', '"\\uD83D\\uDE00"', '"\\u0000"', '"\\b\\f\\r"']:
        assert rx.fullmatch(t), t
    for t in ['"\x01"', '"\n"', '"\\"', '"\\x41"', '"\\u12"', '"\\ud800"', '"\\udc00x"', '"a"b"', "'a'", '"a']:
        assert not rx.fullmatch(t), t


def test_lengths_count_decoded_characters():
    rx = rx_for({"type": "string", "minLength": 2, "maxLength": 3})
    for s in ["ab", "abc", "\n\t", "é日", "a\\b"]:
        assert rx.fullmatch(json.dumps(s, ensure_ascii=False)), s
        assert rx.fullmatch(json.dumps(s)), s
    for s in ["a", "abcd", "\n", "😀", "é日本a"]:
        assert not rx.fullmatch(json.dumps(s, ensure_ascii=False)), s
        assert not rx.fullmatch(json.dumps(s)), s
    # an escaped surrogate pair is one character: never counted as two towards minLength
    assert not rx.fullmatch('"\\ud83d\\ude00"')
    assert rx.fullmatch('"😀😀"')


def test_large_max_length_is_capped_and_reported():
    from gdserve.grammar.json.schema import STRING_LENGTH_CAP, compile_json_schema

    r = compile_json_schema({"type": "string", "maxLength": 5000})
    assert r.narrowed and "5000" in r.narrowed[0]
    rx = re.compile(r.regex)
    assert rx.fullmatch(json.dumps("x" * STRING_LENGTH_CAP))
    assert not rx.fullmatch(json.dumps("x" * (STRING_LENGTH_CAP + 1)))
    with pytest.raises(GrammarError, match="minimum repetition"):
        schema_to_regex({"type": "string", "minLength": 100000})


@pytest.mark.parametrize("pattern,yes,no", [
    ("^[a-z]+$", ["abc"], ["", "aBc", "ab1"]),
    ("abc", ["abc", "xabcx", "zzabc"], ["ab", "acb"]),
    ("^ab", ["ab", "abzz"], ["zab"]),
    ("b$", ["ab", "b"], ["ba"]),
    ("^(foo|bar)$", ["foo", "bar"], ["foobar", "fo"]),
    ("^a|b$", ["ax", "xb", "ab"], ["xa", "bx"]),
    (r"^\d{3}-\d{4}$", ["555-1234"], ["5551234", "555-12345", "٣٣٣-1234"]),
    (r"^\w+@\w+\.com$", ["a_b@c1.com"], ["a b@c.com", "é@c.com"]),
    (r"^[^\s]+$", ["abc", "a-b"], ["a b", "a\tb", ""]),
    (r"^\S\D\W$", ["a-."], ["a1.", "aaa", " -."]),
    (r"^[\u0041-\u0043]{2}$", ["AB", "CC"], ["AD", "A"]),
    (r"^\.\*\+\?\(\)\[\]\{\}\|\\\/$", [".*+?()[]{}|\\/"], ["x"]),
    (r"^a{2,3}$", ["aa", "aaa"], ["a", "aaaa"]),
    (r"^(?:ab)*c?$", ["", "abab", "abc", "c"], ["aba", "cc"]),
    (r'^"[^"]*"$', ['"x"', '""'], ['"a"b"', "x"]),
    (r"^.$", ["a", "é", "😀"], ["\n", "\r", "ab", ""]),
    (r"^[^a]$", ["b", "é", '"', "\\", "\n"], ["a", ""]),
    (r"^x{2}$", ["xx"], ["x", "xxx"]),
    (r"^a{,2}$", [], []),  # ambiguous between engines: rejected below
])
def test_patterns(pattern, yes, no):
    if "{," in pattern:
        with pytest.raises(GrammarError):
            schema_to_regex({"type": "string", "pattern": pattern})
        return
    rx = rx_for({"type": "string", "pattern": pattern})
    for s in yes:
        assert re.search(pattern, s), s  # the test's own premise
        for enc in (json.dumps(s), json.dumps(s, ensure_ascii=False)):
            assert rx.fullmatch(enc), (pattern, s, enc)
    for s in no:
        for enc in (json.dumps(s), json.dumps(s, ensure_ascii=False)):
            assert not rx.fullmatch(enc), (pattern, s, enc)


@pytest.mark.parametrize("pattern", [r"(?=a)b", r"(?!a)", r"(?<=a)b", r"(a)\1", r"\bword\b", r"\p{L}", r"a\Z",
                                     "a(?i)b", "[a-", "(ab", "ab)", "*a", "a**", r"x\k<n>", r"a$b", r"a(^b)", "[^]x]", "[]a]"])
def test_unsupported_patterns_raise(pattern):
    with pytest.raises(GrammarError, match="pattern"):
        schema_to_regex({"type": "string", "pattern": pattern})
    regex, relaxed = schema_to_regex({"type": "string", "pattern": pattern}, lenient=True)
    assert any(r.startswith("pattern at /") for r in relaxed)


def test_pattern_translation_is_sound_against_python_re():
    """Random strings over a mixed alphabet: whatever the translated regex accepts, re.search agrees."""
    patterns = [r"^[a-c]+\d?$", r"a.c", r"^\s*x\s*$", r"[^a-z]", r"^(a|bc)*$", r"\W", r"^\D+$", r"^[\w.-]+$",
                r"^.{2,4}$", r"^[^\d\s]+$", r"c$", r"^[\[\]\\]+$"]
    alphabet = ["a", "b", "c", "x", "1", "٣", " ", "\t", "\n", ".", "-", "é", "😀", '"', "\\", "[", "]", "_", "\u00a0",
                "\ufeff", "\x1c"]
    rng = random.Random(11)
    for pattern in patterns:
        rx = rx_for({"type": "string", "pattern": pattern})
        hits = 0
        for _ in range(1500):
            s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
            for enc in (json.dumps(s), json.dumps(s, ensure_ascii=False)):
                if rx.fullmatch(enc):
                    hits += 1
                    assert re.search(pattern, s), (pattern, s)
        assert hits, pattern


def test_pattern_with_length_bounds():
    rx = rx_for({"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 5, "minLength": 2})
    ok = re.compile("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    for s in ["a", "ab", "a-b", "abcde", "abcdef", "a--b", "-ab", "ab-"]:
        expect = 2 <= len(s) <= 5 and ok.search(s) is not None
        assert (rx.fullmatch(json.dumps(s)) is not None) == expect, s
    # two variable parts: bounded soundly (a subset) and reported
    from gdserve.grammar.json.schema import compile_json_schema

    r = compile_json_schema({"type": "string", "pattern": "^[a-z]+-[a-z]+$", "maxLength": 10})
    assert r.narrowed
    rx = re.compile(r.regex)
    assert rx.fullmatch('"ab-cd"') and not rx.fullmatch(json.dumps("abcde-fghij"))
    # an unanchored pattern with a minimum that needs counting across parts: error (strict)
    with pytest.raises(GrammarError, match="minLength/maxLength"):
        schema_to_regex({"type": "string", "pattern": "a", "minLength": 3, "maxLength": 5})


def _fmt(name):
    return rx_for({"type": "string", "format": name})


def test_format_date_exact():
    rx = _fmt("date")
    import datetime

    rng = random.Random(5)
    samples = [f"{y:04d}-{m:02d}-{d:02d}" for y in (1, 4, 100, 400, 1900, 2000, 2023, 2024, 9999)
               for m in (1, 2, 4, 12, 13) for d in (0, 1, 28, 29, 30, 31, 32)]
    samples += [f"{rng.randint(0, 9999):04d}-{rng.randint(0, 13):02d}-{rng.randint(0, 32):02d}" for _ in range(3000)]
    for s in samples:
        try:
            datetime.date.fromisoformat(s)
            expect = True
        except ValueError:
            expect = False
        assert (rx.fullmatch(json.dumps(s)) is not None) == expect, s
    for s in ["2024-1-01", "20240101", "2024-01-01T00:00:00Z", " 2024-01-01"]:
        assert not rx.fullmatch(json.dumps(s)), s


def test_format_ipv4_and_ipv6_against_ipaddress():
    rng = random.Random(9)
    v4, v6 = _fmt("ipv4"), _fmt("ipv6")
    cands = ["0.0.0.0", "255.255.255.255", "1.2.3", "01.2.3.4", "1.2.3.256", "::", "::1", "1::", "1:2:3:4:5:6:7:8",
             "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1::8", "1:2:3:4:5:6:1.2.3.4", "::ffff:1.2.3.4", "1:2:3:4:5:6:7:8:9",
             ":::", "1:::2", "12345::", "g::1", "::1.2.3.04", "1::2::3", "fe80::1%eth0"]
    for _ in range(3000):
        parts = [rng.choice(["", "0", "1", "ff", "ffff", "12345", "1.2.3.4", "255", "256"]) for _ in range(rng.randint(1, 9))]
        cands.append(rng.choice([":", ".", "::"]).join(parts))
    for s in cands:
        for rx, cls in ((v4, ipaddress.IPv4Address), (v6, ipaddress.IPv6Address)):
            if rx.fullmatch(json.dumps(s)):
                cls(s)  # raises if our regex accepted an invalid address
    for s in ["1.2.3.4", "10.0.0.255"]:
        assert v4.fullmatch(json.dumps(s))
    for s in ["::", "::1", "2001:db8::ff00:42:8329", "1:2:3:4:5:6:7:8", "::ffff:192.0.2.128", "1:2:3:4:5:6:7::"]:
        assert v6.fullmatch(json.dumps(s)), s


def test_format_uuid_email_hostname_uri_time():
    u = _fmt("uuid")
    for _ in range(50):
        x = str(uuid.uuid4())
        assert u.fullmatch(json.dumps(x)) and u.fullmatch(json.dumps(x.upper()))
    assert not u.fullmatch('"{12345678-1234-1234-1234-123456789012}"')
    e = _fmt("email")
    assert e.fullmatch('"first.last+tag@example.co.uk"') and e.fullmatch('"x@localhost"')
    for s in ["@x.com", "a@", "a@@b", "a b@c.d", "a.@b.c", ".a@b.c", "a@-b.c"]:
        assert not e.fullmatch(json.dumps(s)), s
    h = _fmt("hostname")
    assert h.fullmatch('"example.com"') and h.fullmatch(json.dumps("a" * 63 + ".b"))
    for s in ["-a.com", "a-.com", "a..b", "a" * 64, "a_b.com", "", "a.b.c.d." + "x" * 63]:
        assert not h.fullmatch(json.dumps(s)), s
    uri = _fmt("uri")
    for s in ["https://example.com", "http://u:p@[::1]:8080/a%20b?q=1#f", "urn:isbn:123", "mailto:a@b.c", "file:///etc/x"]:
        assert uri.fullmatch(json.dumps(s)), s
        assert uri.fullmatch(json.dumps(s).replace("/", "\\/")), s
    for s in ["example.com", "/relative", "http://a b", "http://x/%zz", "1http://x"]:
        assert not uri.fullmatch(json.dumps(s)), s
    t = _fmt("time")
    for s in ["00:00:00Z", "23:59:59.999+14:00", "12:00:00-05:30", "23:59:60Z", "23:59:60+00:00"]:
        assert t.fullmatch(json.dumps(s)), s
    for s in ["24:00:00Z", "12:60:00Z", "12:00:00", "12:00:60Z", "12:00:00+24:00", "1:00:00Z"]:
        assert not t.fullmatch(json.dumps(s)), s


def test_all_formats_have_patterns():
    assert set(FORMATS) == {"date", "time", "date-time", "email", "uuid", "uri", "ipv4", "ipv6", "hostname",
                            "uri-reference", "iri", "iri-reference", "idn-email", "json-pointer",
                            "relative-json-pointer", "duration"}
    with pytest.raises(GrammarError, match="format 'idn-hostname'"):
        schema_to_regex({"type": "string", "format": "idn-hostname"})
    regex, relaxed = schema_to_regex({"type": "string", "format": "idn-hostname"}, lenient=True)
    assert relaxed == ["format 'idn-hostname' at /"]
    assert re.fullmatch(regex, '"a.b"')
    # names outside the JSON Schema vocabularies are annotations, as validators treat them
    regex, relaxed = schema_to_regex({"type": "string", "format": "semver"})
    assert relaxed == ["format 'semver' at / (not a JSON Schema format: an annotation)"]
    assert re.fullmatch(regex, '"1.2.3"') and re.fullmatch(regex, '"anything"')
    # format constrains strings only
    rx = rx_for({"format": "ipv4"})
    assert rx.fullmatch("12") and rx.fullmatch('"1.2.3.4"') and not rx.fullmatch('"1.2.3"')


def test_more_formats():
    cases = {
        "uri-reference": (["https://a.b/c", "/x/y?z#w", "../up", "", "#frag", "?q", "a:b", "//host/p"],
                          ["a b", "%zz", "x\\y"]),
        "json-pointer": (["", "/a", "/a~0b/c~1d", "/"], ["a", "/~2", "/~"]),
        "relative-json-pointer": (["0", "1#", "12/a/b", "0/"], ["01", "-1", "#", "/a"]),
        "duration": (["P1D", "PT1H", "P1Y2M3DT4H5M6S", "P2W", "PT30S", "P1M", "PT1H30M"],
                     ["P", "PT", "P1H", "1D", "P1D2Y", "P1W2D", "PT1S2M"]),
    }
    for fmt, (yes, no) in cases.items():
        rx = _fmt(fmt)
        for s in yes:
            assert rx.fullmatch(json.dumps(s)), (fmt, s)
        for s in no:
            assert not rx.fullmatch(json.dumps(s)), (fmt, s)


@pytest.mark.parametrize("schema", [{"const": "a\ud800"}, {"enum": ["ok", "\udc00"]},
                                    {"type": "object", "properties": {"\ud83d": {"type": "integer"}}}])
def test_lone_surrogates_are_refused_by_name_on_both_paths(schema):
    for compile_schema in (schema_to_regex, lambda s: schema_to_grammar(s, open_objects=True)):
        with pytest.raises(GrammarError, match="lone surrogate"):
            compile_schema(schema)
