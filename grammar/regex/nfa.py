"""A regex as a byte-level NFA (Thompson's construction, in C: grammar/csrc/regex_parse.c parses
the pattern, grammar/csrc/nfa_build.c builds its NFA with bounded repetitions written out), in flat
arrays that grammar/csrc/byte_dfa.c determinizes in time proportional to the DFA's transitions.

outlines-core determinizes a JSON schema's regex at tens of microseconds a state (and its tables
are converted after); this construction is linear in the regex once its bounded repetitions are
written out, and each of its DFA states costs microseconds in C. It reads the dialect that
json.schema and choice lists write and the common part of user regexes: literal characters,
escapes (`\\n`, `\\xNN`, `\\x{N}`, `\\uNNNN`, `\\u{N}`, `\\UNNNNNNNN`, escaped punctuation), `.`,
flat character classes (ranges, negation), groups, alternation and repetition, and a pattern
ending in `\\z` (token_index.indexed_pattern's form: a full match, the plain language). Anything
else (Unicode classes such as `\\d`, flags, nested classes, class set operations) raises
Unsupported, and the caller keeps outlines-core's DFA: the same language either way. The Python
construction it is held to is tests/grammar/regex/nfa_oracle.py.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from gdserve.grammar import native

MAX_NFA_NODES = 4_000_000  # beyond this the regex is left to outlines-core (and its limits)
REGEX_NO_MEMORY, REGEX_TOO_LARGE, REGEX_UNSUPPORTED = -1, -2, -3  # regex_parse.h's codes


class Unsupported(Exception):
    """Syntax this construction does not read (the caller falls back to outlines-core)."""


class TooManyNodes(Unsupported):
    """A pattern past MAX_NFA_NODES: its automaton would be larger still, so the caller refuses it
    (outlines-core's construction aborts the process where memory runs out)."""


@dataclass(frozen=True)
class ByteNFA:
    """Nodes 0..n-1; `start` and `accept` nodes; epsilon edges and byte-class-range edges in CSR
    form; bytes in `class_of` intervals (a range of bytes is a range of classes)."""
    start: int
    accept: int
    eps_ptr: np.ndarray   # int32 [n + 1]
    eps_to: np.ndarray    # int32 [E]
    edge_ptr: np.ndarray  # int32 [n + 1]
    edge_lo: np.ndarray   # int32 [B]: the edge's first class
    edge_hi: np.ndarray   # int32 [B]: its last class
    edge_to: np.ndarray   # int32 [B]
    class_of: np.ndarray  # uint8 [256]: byte -> class, ascending with the byte

    @property
    def num_nodes(self) -> int:
        return len(self.eps_ptr) - 1

    @property
    def num_classes(self) -> int:
        return int(self.class_of[-1]) + 1


def build_nfa(pattern: str) -> ByteNFA:
    """The NFA of a `\\z`-anchored pattern; raises Unsupported (TooManyNodes past MAX_NFA_NODES),
    and Unsupported where the native library is missing (the caller keeps outlines-core's DFA)."""
    lib = native.library()
    if lib is None:
        raise Unsupported("the grammar's native library is not available")
    text = _utf8(pattern)
    status, accept, error_at, reason = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int64(), ctypes.c_char_p()
    handle = lib.nfa_build_regex(text, len(text), MAX_NFA_NODES, ctypes.byref(status), ctypes.byref(accept),
                                 ctypes.byref(error_at), ctypes.byref(reason))
    try:
        if status.value == REGEX_UNSUPPORTED:
            raise Unsupported(f"{reason.value.decode()} at byte {error_at.value}")
        if status.value == REGEX_TOO_LARGE:
            raise TooManyNodes(f"more than {MAX_NFA_NODES:,} NFA nodes")
        if status.value != 0 or not handle:
            raise MemoryError("out of memory for a regex's NFA")
        eps_p, edges_p = ctypes.POINTER(ctypes.c_int32)(), ctypes.POINTER(ctypes.c_int32)()
        num_eps, num_edges = ctypes.c_int64(), ctypes.c_int64()
        num_nodes = lib.nfa_result(handle, ctypes.byref(eps_p), ctypes.byref(num_eps), ctypes.byref(edges_p),
                                   ctypes.byref(num_edges))
        class_of = np.empty(256, dtype=np.uint8)
        eps_ptr, edge_ptr = np.empty(num_nodes + 1, dtype=np.int32), np.empty(num_nodes + 1, dtype=np.int32)
        eps_to = np.empty(num_eps.value, dtype=np.int32)
        edge_lo, edge_hi, edge_to = (np.empty(num_edges.value, dtype=np.int32) for _ in range(3))
        lib.nfa_csr(handle, *(a.ctypes.data for a in (class_of, eps_ptr, eps_to, edge_ptr, edge_lo, edge_hi, edge_to)))
    finally:
        if handle:
            lib.nfa_free(handle)
    return ByteNFA(0, accept.value, eps_ptr, eps_to, edge_ptr, edge_lo, edge_hi, edge_to, class_of)


def expanded_size(regex: str) -> int | None:
    """The regex's size with every bounded repetition written out (regex.tree's `size`), read by
    the native parse; None where it does not read the syntax or the native library is missing."""
    lib = native.library()
    if lib is None:
        return None
    try:
        text = _utf8(regex)
    except Unsupported:
        return None
    size = lib.regex_expanded_size(text, len(text))
    return None if size < 0 else size


def _utf8(pattern: str) -> bytes:
    try:
        return pattern.encode()
    except UnicodeEncodeError:
        raise Unsupported("a lone surrogate") from None
