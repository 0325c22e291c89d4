"""A byte scanner of the JSON text a matcher has read, for uniqueItems over scalar items.

The grammar already guarantees the text is a prefix of valid JSON; the scanner only follows its
structure: the open containers (each object's current key, each array's items so far when the
array is one whose items must be unique) and the scalar being read. A scalar item completes at
its closing quote (strings) or at the first byte after it (numbers, true, false, null), and
`byte` refuses the byte that would complete a duplicate (JSON equality: 1 == 1.0, "a" == "\\u0061",
true != 1). A Scan is an immutable value: one per accepted token, shared where unchanged.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from gdserve.grammar.json.unique_paths import ITEM, Path, matches

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
        # Scans are built directly, not with dataclasses.replace: this runs per byte of every
        # token a fill checks.
        frames = scan.frames
        if scan.in_string:
            text = scan.text + bytes((b,))
            if scan.escaped or b != QUOTE:
                return Scan(frames, text, True, not scan.escaped and b == BACKSLASH)
            return self._complete(frames, text)
        if scan.text is not None:
            if b in _SCALAR_BYTES:
                return Scan(frames, scan.text + bytes((b,)))
            scan = self._complete(frames, scan.text)
            if scan is None:
                return None
            frames = scan.frames
        if b == QUOTE:
            return Scan(frames, b'"', True)
        if b in _SCALAR_START:
            return Scan(frames, bytes((b,)))
        if b in b"{[":
            return Scan(frames + (self._open(frames, b == ord("[")),))
        if b in b"}]":
            return Scan(frames[:-1])
        if b == ord(",") and frames:
            if frames[-1].is_array:
                return Scan(frames, awaits_item=True)
            return Scan(frames[:-1] + (Frame(False),))
        return scan

    def _open(self, frames: tuple[Frame, ...], is_array: bool) -> Frame:
        path = tuple(f.step for f in frames)
        return Frame(is_array, seen=frozenset() if is_array and self.unique(path) else None)

    def _complete(self, frames: tuple[Frame, ...], text: bytes) -> Scan | None:
        """The scan after the scalar `text` completes: an object's key read, or an item of a
        unique array kept (None if it repeats one)."""
        if not frames:
            return Scan(frames)
        top = frames[-1]
        if not top.is_array and top.key is None:
            return Scan(frames[:-1] + (Frame(False, json.loads(text)),))
        if top.seen is None:
            return Scan(frames)
        key = item_key(text)
        if key in top.seen:
            return None
        return Scan(frames[:-1] + (Frame(True, seen=top.seen | {key}),))


def path_matcher(paths: frozenset[Path]) -> Callable[[tuple], bool]:
    """unique(path) for Scanner: whether some pattern of `paths` names the container path."""
    by_length: dict[int, list[Path]] = {}
    for p in paths:
        by_length.setdefault(len(p), []).append(p)
    return lambda frames: any(matches(p, frames) for p in by_length.get(len(frames), ()))
