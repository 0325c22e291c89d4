"""Byte DFAs put together from smaller ones without determinizing again: concatenation and
bounded repetition, where the seam is deterministic (at every accepting state of the left part,
no byte both continues it and starts the right part). JSON's pieces mostly are (a string's
characters are a prefix-free code, a closing quote starts no character), and these two cover the
costly shape of JSON Schema terminals: strings of bounded length, whose DFA outlines-core builds
at ~20 µs a state (4,000 states for maxLength 256) and in time exponential in the bound when the
repetition comes first.

ByteDFA's conventions hold: states 0..dead, `dead` the last, absorbing and never accepting.
concat and repeat keep the states reachable from the start; from_table (a table built by hand,
as json.keys does) keeps every state. Nothing is minimized (no caller needs that).
"""
import numpy as np

from gdserve.grammar.token_index import ByteDFA, byte_classes


def joint_classes(class_maps: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(uint8 [256] byte -> joint class, per map its class of each joint class), for byte -> class
    maps (values below 257) that must all be told apart; joint classes numbered by first byte."""
    key = np.zeros(256, dtype=np.int64)
    for m in class_maps:
        key = key * 257 + m.astype(np.int64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    renumber = np.empty(len(first), dtype=np.int64)
    renumber[np.argsort(first)] = np.arange(len(first))
    classes = renumber[inverse.reshape(256)].astype(np.uint8)
    picks = np.sort(first)
    return classes, [m[picks].astype(np.int64) for m in class_maps]


def _joint_classes(dfas: list[ByteDFA]) -> tuple[np.ndarray, list[np.ndarray]]:
    return joint_classes([d.classes for d in dfas])


def _live_rows(dfa: ByteDFA, cls: np.ndarray) -> np.ndarray:
    """int64 [dead, J]: each live state's next state by joint class, -1 where it dies."""
    table = dfa.trans[:-1][:, cls].astype(np.int64)
    return np.where(table == dfa.dead, -1, table)


def concat(a: ByteDFA, b: ByteDFA) -> ByteDFA | None:
    """The DFA of a's language then b's; None where the seam is not deterministic."""
    classes, (ca, cb) = _joint_classes([a, b])
    ta, tb = _live_rows(a, ca), _live_rows(b, cb)
    na = a.dead
    tb = np.where(tb >= 0, tb + na, -1)
    b_first = tb[b.start]
    seams = np.flatnonzero(a.final[:-1])
    if ((ta[seams] >= 0) & (b_first >= 0)[None]).any():
        return None
    ta[seams] = np.where(ta[seams] >= 0, ta[seams], b_first[None])
    rows = np.concatenate([ta, tb])
    final = np.concatenate([a.final[:-1], b.final[:-1]])
    final[seams] = b.final[b.start]
    return _dfa(classes, rows, final, a.start)


def repeat(c: ByteDFA, lo: int, hi: int) -> ByteDFA | None:
    """c's language lo..hi times (hi >= 1); None where c matches the empty string or the seam
    between copies is not deterministic."""
    if c.final[c.start] or hi < max(lo, 1):
        return None
    classes, (cc,) = _joint_classes([c])
    t = _live_rows(c, cc)
    m = c.dead
    seams = np.flatnonzero(c.final[:-1])
    first = t[c.start]
    if hi > 1 and ((t[seams] >= 0) & (first >= 0)[None]).any():
        return None
    offsets = (np.arange(hi, dtype=np.int64) * m)[:, None, None]
    rows = np.where(t[None] >= 0, t[None] + offsets, -1)           # [hi, m, J]: copy k reads item k+1
    nxt = np.where(first[None] >= 0, first[None] + offsets[1:, 0], -1)  # [hi-1, J]: copy k+1's first step
    for s in seams.tolist():
        rows[:-1, s] = np.where(rows[:-1, s] >= 0, rows[:-1, s], nxt)
    final = np.zeros((hi, m), dtype=bool)
    final[lo - 1 if lo else 0:] = c.final[:-1]
    rows, final = rows.reshape(hi * m, -1), final.reshape(-1)
    start = c.start
    if lo == 0:  # a fresh start that accepts: c's start may be entered again inside c
        rows = np.concatenate([rows, rows[start][None]])
        final = np.concatenate([final, [True]])
        start = len(final) - 1
    return _dfa(classes, rows, final, start)


def from_table(rows: np.ndarray, final: np.ndarray, start: int) -> ByteDFA:
    """ByteDFA of rows over the 256 bytes (-1 = dies), every state kept (a caller that builds
    few unreachable ones saves the search), bytes no state tells apart in one class."""
    dead = len(rows)
    table = np.concatenate([np.where(rows < 0, dead, rows), np.full((1, 256), dead)]).astype(np.int32)
    trans, classes = byte_classes(table)
    return ByteDFA(classes, trans, np.concatenate([final, [False]]), start)


def _dfa(classes: np.ndarray, rows: np.ndarray, final: np.ndarray, start: int) -> ByteDFA:
    """ByteDFA of the states reachable from `start` in live rows (-1 = dies; final [len(rows)]),
    start first, the dead state appended."""
    seen = np.zeros(len(rows) + 1, dtype=bool)  # the last entry absorbs -1
    seen[start] = True
    frontier = np.array([start])
    while frontier.size:
        nxt = np.unique(rows[frontier])
        frontier = nxt[~seen[nxt]]
        seen[frontier] = True
    keep = np.flatnonzero(seen[:-1])
    keep = np.concatenate([[start], keep[keep != start]])
    dead = len(keep)
    renumber = np.full(len(rows) + 1, dead, dtype=np.int64)  # -1 (the last entry) -> dead
    renumber[keep] = np.arange(dead)
    trans = np.concatenate([renumber[rows[keep]], np.full((1, rows.shape[1]), dead)])
    return ByteDFA(classes, trans.astype(np.int32), np.concatenate([final[keep], [False]]), 0)
