"""A byte scanner of the JSON text a matcher has read, for uniqueItems over scalar items.

The grammar already guarantees the text is a prefix of valid JSON; the scanner only follows its
structure: the open containers (each object's current key, each array's items so far when the
array is one whose items must be unique) and the scalar being read. A scalar item completes at
its closing quote (strings) or at the first byte after it (numbers, true, false, null), and
`byte` refuses the byte that would complete a duplicate (JSON equality: 1 == 1.0, "a" == "\\u0061",
true != 1). Scans are copied per token, so its fields are immutable values.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal

from gdserve.grammar.json_unique_paths import ITEM, Path, matches

QUOTE, BACKSLASH = ord('"'), ord("\\")
_SCALAR_BYTES = frozenset(b"0123456789+-.eEtruefalsn")  # what continues a number or literal
_SCALAR_START = frozenset(b"-0123456789tfn")

ItemKey = tuple  # an item's value under JSON equality, hashable


@dataclass(frozen=True)
class Frame:
    """One open container: an object with its current key (None until read), or an array with
    the keys of its items so far (None: its items need not be unique)."""
    is_array: bool
    key: str | None = None
    seen: frozenset[ItemKey] | None = None

    @property
    def step(self):
        return ITEM if self.is_array else self.key


@dataclass(frozen=True)
class Scan:
    frames: tuple[Frame, ...] = ()
    text: bytes | None = None   # the scalar being read (a string with its quotes), None between values
    in_string: bool = False
    escaped: bool = False       # the last byte was a backslash inside a string
    awaits_item: bool = False   # after an array's `,`: an item must follow

    @property
    def seen(self) -> frozenset[ItemKey] | None:
        """The unique array's items so far, where the innermost container is such an array."""
        return self.frames[-1].seen if self.frames and self.frames[-1].is_array else None

    @property
    def in_unique_item(self) -> bool:
        return self.text is not None and self.seen is not None

    @property
    def owes_unique_item(self) -> bool:
        """Inside an item of a unique array that holds items already, or before one it needs."""
        return bool(self.seen) and (self.text is not None or self.awaits_item)

    def in_unique_array(self) -> bool:
        return any(f.seen is not None for f in self.frames)


def item_key(text: bytes) -> ItemKey:
    """A scalar's value under JSON equality (numbers as exact decimals, strings decoded)."""
    if text[0] == QUOTE:
        return ("string", json.loads(text))
    if text in (b"true", b"false", b"null"):
        return ("literal", text)
    return ("number", Decimal(text.decode()))


def items_read(scan: Scan) -> tuple[int, int]:
    """(open containers, items of the innermost unique array): what grows as an item completes."""
    return len(scan.frames), len(scan.seen or ())


def decoded_prefix(text: bytes) -> str | None:
    """The characters of an open string so far; None while an escape is incomplete."""
    try:
        return json.loads(text + b'"')
    except ValueError:
        return None


class Scanner:
    """Advances a Scan by bytes; `unique(path)` says which arrays keep their items unique."""

    def __init__(self, unique: Callable[[tuple], bool]):
        self.unique = unique

    def feed(self, scan: Scan, data: bytes) -> Scan | None:
        """The scan after `data`; None where a byte completes a duplicate item."""
        for b in data:
            scan = self.byte(scan, b)
            if scan is None:
                return None
        return scan

    def byte(self, scan: Scan, b: int) -> Scan | None:
        if scan.in_string:
            text = scan.text + bytes([b])
            if scan.escaped or b != QUOTE:
                return replace(scan, text=text, escaped=not scan.escaped and b == BACKSLASH)
            return self._complete(replace(scan, text=text, in_string=False))
        if scan.text is not None:
            if b in _SCALAR_BYTES:
                return replace(scan, text=scan.text + bytes([b]))
            scan = self._complete(scan)
            if scan is None:
                return None
        if b == QUOTE:
            return replace(scan, text=b'"', in_string=True, awaits_item=False)
        if b in _SCALAR_START:
            return replace(scan, text=bytes([b]), awaits_item=False)
        if b in b"{[":
            return self._open(replace(scan, awaits_item=False), b == ord("["))
        if b in b"}]":
            return replace(scan, frames=scan.frames[:-1])
        if b == ord(",") and scan.frames:
            if scan.frames[-1].is_array:
                return replace(scan, awaits_item=True)
            return replace(scan, frames=scan.frames[:-1] + (Frame(False),))
        return scan

    def _open(self, scan: Scan, is_array: bool) -> Scan:
        path = tuple(f.step for f in scan.frames)
        seen = frozenset() if is_array and self.unique(path) else None
        return replace(scan, frames=scan.frames + (Frame(is_array, seen=seen),))

    def _complete(self, scan: Scan) -> Scan | None:
        text, frames = scan.text, scan.frames
        scan = replace(scan, text=None)
        if not frames:
            return scan
        top = frames[-1]
        if not top.is_array and top.key is None:
            return replace(scan, frames=frames[:-1] + (Frame(False, json.loads(text)),))
        if top.seen is None:
            return scan
        key = item_key(text)
        if key in top.seen:
            return None
        return replace(scan, frames=frames[:-1] + (replace(top, seen=top.seen | {key}),))


def path_matcher(paths: frozenset[Path]) -> Callable[[tuple], bool]:
    """unique(path) for Scanner: whether some pattern of `paths` names the container path."""
    by_length: dict[int, list[Path]] = {}
    for p in paths:
        by_length.setdefault(len(p), []).append(p)
    return lambda frames: any(matches(p, frames) for p in by_length.get(len(frames), ()))
