"""String `format`s as anchored ECMA patterns (translated like any `pattern` by json.strings).

Each pattern accepts a subset of what the format's RFC allows, never more:

- date: RFC 3339 full-date, month lengths and leap years exact; year 0000 excluded (Python's
  `date.fromisoformat`, which jsonschema uses, has no year 0).
- time: RFC 3339 full-time (`HH:MM:SS[.frac](Z|z|+HH:MM|-HH:MM)`); a leap second (:60) only at
  23:59:60 with a zero offset.
- date-time: full-date `T`/`t` full-time.
- email: dot-atom local part `@` hostname-style domain (quoted local parts and address literals
  are left out).
- uuid: 8-4-4-4-12 hex digits, either case.
- uri: RFC 3986 `URI` (absolute, with a scheme), IP literals included.
- ipv4: dotted quad without leading zeros. ipv6: RFC 4291 text forms with `::` compression and an
  embedded IPv4 tail (no zone ids).
- uri-reference: a URI or an RFC 3986 relative reference. iri, iri-reference, idn-email: the ASCII
  forms above (subsets of the internationalized ones).
- json-pointer (RFC 6901), relative-json-pointer, duration (RFC 3339 appendix A, ISO 8601).
- hostname: RFC 1123 labels (letters, digits, inner hyphens, 1..63 chars); to keep the total within
  253 characters without counting, either at most 3 labels of up to 63 characters or 4..8 labels of
  up to 30 characters.
"""

from __future__ import annotations

_DEC_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"(?:{_DEC_OCTET}\.){{3}}{_DEC_OCTET}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "(?:" + "|".join([
    rf"(?:{_H16}:){{6}}{_LS32}",
    rf"::(?:{_H16}:){{5}}{_LS32}",
    rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"

_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
    rf"|{_LEAP_YEAR}-02-29)"
)
_FRAC = r"(?:\.[0-9]+)?"
_OFFSET = r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_TIME = (
    rf"(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]{_FRAC}{_OFFSET}"
    rf"|23:59:60{_FRAC}(?:[Zz]|[+-]00:00))"
)


def _label(n: int) -> str:
    return rf"[A-Za-z0-9](?:[A-Za-z0-9-]{{0,{n - 2}}}[A-Za-z0-9])?"


_HOSTNAME = rf"(?:{_label(63)}(?:\.{_label(63)}){{0,2}}|{_label(30)}(?:\.{_label(30)}){{3,7}})"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_EMAIL = rf"{_ATOM}(?:\.{_ATOM})*@{_label(63)}(?:\.{_label(63)})*"

_PCT = r"%[0-9A-Fa-f]{2}"
_UNRES_SUB = r"A-Za-z0-9._~!$&'()*+,;="
_PCHAR = rf"(?:[{_UNRES_SUB}:@-]|{_PCT})"
_AUTHORITY = (
    rf"(?:(?:[{_UNRES_SUB}:-]|{_PCT})*@)?"
    rf"(?:\[(?:{_IPV6}|[vV][0-9A-Fa-f]+\.[{_UNRES_SUB}:-]+)\]|(?:[{_UNRES_SUB}-]|{_PCT})*)"
    r"(?::[0-9]*)?"
)
_URI = (
    r"[A-Za-z][A-Za-z0-9+.-]*:"
    rf"(?://{_AUTHORITY}(?:/{_PCHAR}*)*|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_PCHAR}+(?:/{_PCHAR}*)*|)"
    rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
)

_PCHAR_NC = rf"(?:[{_UNRES_SUB}@-]|{_PCT})"
_QUERY_FRAGMENT = rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
_RELATIVE_REF = (
    rf"(?://{_AUTHORITY}(?:/{_PCHAR}*)*|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_PCHAR_NC}+(?:/{_PCHAR}*)*|)"
    + _QUERY_FRAGMENT
)
_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"
_DURATION = (
    r"P(?:[0-9]+W"
    r"|(?:[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)(?:T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S))?"
    r"|T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S))"
)

FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "email": _EMAIL,
    "uuid": r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",
    "uri": _URI,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "hostname": _HOSTNAME,
    "uri-reference": f"(?:{_URI}|{_RELATIVE_REF})",
    # ASCII subsets of the internationalized forms
    "iri": _URI,
    "iri-reference": f"(?:{_URI}|{_RELATIVE_REF})",
    "idn-email": _EMAIL,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": rf"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})",
    "duration": _DURATION,
}


def format_pattern(name: str) -> str | None:
    """The anchored ECMA pattern for a supported format, else None."""
    p = FORMATS.get(name)
    return None if p is None else f"^(?:{p})$"


# Formats of the JSON Schema vocabularies (draft 3 to 2020-12): asserted, so one we can't write as
# a pattern is refused. Any other name is an annotation (validators ignore unknown formats).
KNOWN_FORMATS = frozenset(FORMATS) | {
    "idn-hostname", "uri-template", "regex", "host-name", "ip-address", "color", "style", "phone",
    "utc-millisec",
}


def is_known_format(name: str) -> bool:
    return name in KNOWN_FORMATS
