"""Object keys other than the declared names: a JSON string whose decoded value is none of
`names` (the key of an additional or catch-all pattern property), as a regex for the regex path
and as a byte DFA built directly for the grammar path.

The language (both forms): either the key leaves the trie of names at some character (then
anything follows), or it stops at a trie node that is not a name. A name character is matched
in its own spellings only (json.strings: printable ASCII raw, others raw or escaped), so escapes
can't smuggle a declared name in; a character that is in no name is matched in the spellings of
the set of all such characters.

The grammar path writes the key as a placeholder atom (regex.tree.sub_placeholder) that
cfg.lexer turns into key_dfa's DFA: states are the trie's nodes, one shared "left the trie" loop
(a JSON string's characters, then the quote), and the states inside one multi-byte spelling
(an escape, a UTF-8 sequence) read by a small tagged recognizer shared by every key set of the
same non-plain name characters. Written as a regex, the same key cost a fifth of a median
compile to write and outlines-core ~20 µs a state to determinize (18 long keys: 100 ms).
"""
from __future__ import annotations

import functools
import json

import numpy as np

from gdserve.grammar.regex.dfa_ops import from_table
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.strings import (CHAR, Intervals, chars, complement, encode_char, encode_charset,
                                          encodes_each, intersect, string_literal)
from gdserve.grammar.regex.tree import SUB_CLOSE, SUB_OPEN, sub_payload, sub_placeholder
from gdserve.grammar.token_index import ByteDFA, build_byte_dfa, indexed_pattern, start_state

ANY_KEY = f'"{CHAR}*"'
# Characters one raw byte spells: ASCII but controls, `"` and `\`; _PLAIN: those with no
# other spelling in a name (string_literal), all but `/` (also `\/`)
_RAW = frozenset(c for c in map(chr, range(0x20, 0x80)) if c not in '"\\')
_PLAIN = _RAW - {"/"}
_NOT_PLAIN: Intervals = complement(chars(*_PLAIN))
_OTHER_TAG = 0x1F       # recognizer tag byte of "a character in no name"; name characters 1, 2, ...
_MAX_TAGS = _OTHER_TAG - 1


@functools.lru_cache(maxsize=1024)
def key_regex(names: tuple[str, ...]) -> str:
    """The key as a regex (outlines-core's dialect). Each name character is matched in all its
    spellings; a character that is in no name leaves the trie at any node: that way out is
    written once, after a branch that reads any path of the trie, so the DFA shares its escape
    states (written at every node, a hundred names made ~15,000 states)."""
    if not names:
        return ANY_KEY
    trie: dict = {}
    for name in names:
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[None] = True
    name_chars = {c for name in names for c in name}
    in_names = chars(*name_chars)

    def group(alts: list[str | None]) -> str | None:
        alts = [a for a in alts if a is not None]
        if not alts:
            return None
        return alts[0] if len(alts) == 1 and alts[0] else "(?:" + "|".join(alts) + ")"

    def kids(node) -> list[str]:
        return sorted(k for k in node if k is not None)

    @functools.cache
    def spell(c: str) -> str:
        return string_literal(c)[1:-1]

    def any_path(node) -> str:
        return group([""] + [spell(c) + any_path(node[c]) for c in kids(node)])

    def leave_by_name_char(node) -> str | None:
        """A path, then a character of some name that is not a child there."""
        others = name_chars.difference(node)
        return group([encode_charset(chars(*others)) if others else None]
                     + [_prefixed(spell(c), leave_by_name_char(node[c])) for c in kids(node)])

    def prefixes(node) -> str | None:
        return group(([] if None in node else [""])
                     + [_prefixed(spell(c), prefixes(node[c])) for c in kids(node)])

    other = encode_charset(complement(in_names))
    leave = group([any_path(trie) + other if other else None, leave_by_name_char(trie)])
    parts = [None if leave is None else f"{leave}{CHAR}*", prefixes(trie)]
    return '"' + group(parts) + '"'


def _prefixed(head: str, rest: str | None) -> str | None:
    return None if rest is None else head + rest


def key_placeholder(names: tuple[str, ...]) -> str:
    """The key as a regex.tree atom for the grammar path (cfg.lexer builds key_dfa for it);
    ANY_KEY itself where no name is excluded. Its size is about its DFA's states (the trie's
    nodes and ~60 for escapes and the rest of the string); its byte sizes those of key_regex's
    tree: 2 bytes at least (`""`, 3 where the empty name is excluded), and as an optional part a
    surrogate pair's 12 bytes or a name and one more character (leaving the trie at its end)."""
    if not names:
        return ANY_KEY
    nodes = len({name[:i] for name in names for i in range(1, len(name) + 1)}) + 1
    longest = max(len(name.encode("utf-8", "surrogatepass")) for name in names)
    payload = json.dumps(names).encode().hex()
    return sub_placeholder(payload, nodes + 60, (3 if "" in names else 2, max(12, longest + 1)))


def placeholder_names(atom: str) -> tuple[str, ...]:
    return tuple(json.loads(bytes.fromhex(sub_payload(atom))))


def expand_keys(regex: str) -> str:
    """regex with each key placeholder written out as key_regex."""
    out, i = [], 0
    while (j := regex.find(SUB_OPEN, i)) >= 0:
        k = regex.index(SUB_CLOSE, j) + 1
        out += [regex[i:j], key_regex(placeholder_names(regex[j:k]))]
        i = k
    return "".join(out) + regex[i:]


@functools.lru_cache(maxsize=1024)
def key_dfa(names: tuple[str, ...]) -> ByteDFA | None:
    """key_regex(names)'s language as a DFA built without determinizing (see the module
    docstring); None where the recognizer can't take the name characters (more than 30 that
    are not plain; more escaped ones than json.strings spells one by one; a lone surrogate):
    then the caller determinizes key_regex."""
    name_chars = {c for name in names for c in name}
    special = tuple(sorted(c for c in name_chars if c not in _PLAIN))
    if (not names or len(special) > _MAX_TAGS or not encodes_each(chars(*special))
            or any(0xD800 <= ord(c) <= 0xDFFF for c in special)):
        return None
    rec, left = _recognizer(special, bool(name_chars)), _left()
    return _KeyTable(names, special, rec, left).dfa()


class _Recognizer:
    """One JSON character's spelling, started at a non-plain byte (`\\` or a UTF-8 lead byte),
    tagged by what it spells: name character i (tag i + 1) or a character in no name."""

    def __init__(self, special: tuple[str, ...], names_have_chars: bool):
        # a character in no name: every spelling where no name has a character (key_regex)
        other = (encode_charset(intersect(complement(chars(*special)), _NOT_PLAIN)) if names_have_chars
                 else CHAR)
        alts = [f"(?:{other})\\x{_OTHER_TAG:02x}"]
        alts += [f"(?:{encode_char(c)})\\x{i + 1:02x}" for i, c in enumerate(special)]
        dfa = build_byte_dfa(indexed_pattern("|".join(alts)))
        self.start = start_state(dfa)
        self.dead = dfa.dead
        self.next = dfa.trans[:, dfa.classes].astype(np.int64)  # [R, 256]
        tags = [_OTHER_TAG] + list(range(1, len(special) + 1))
        self.done = np.full(len(self.next), -1, dtype=np.int64)  # the tag of a finished spelling
        for t in tags:
            self.done[dfa.final[self.next[:, t]]] = t
        reads = self.next.copy()
        reads[:, tags] = self.dead
        if (reads[self.done >= 0] != self.dead).any():
            raise GrammarError("internal: a JSON character's spelling is a prefix of another's")
        self.live = self._live_tags(reads)

    def _live_tags(self, reads: np.ndarray) -> list[int]:
        """Per state, the bitmask of the tags its spellings can still end in."""
        live = [0 if t < 0 else 1 << int(t) for t in self.done]
        succ = [np.unique(row).tolist() for row in reads]
        changed = True
        while changed:
            changed = False
            for r, nxt in enumerate(succ):
                m = live[r]
                for s in nxt:
                    m |= live[s]
                if m != live[r]:
                    live[r], changed = m, True
        return live


@functools.lru_cache(maxsize=64)
def _recognizer(special: tuple[str, ...], names_have_chars: bool) -> _Recognizer:
    return _Recognizer(special, names_have_chars)


@functools.lru_cache(maxsize=1)
def _left() -> ByteDFA:
    """After the key left the trie: any characters, then the closing quote."""
    return build_byte_dfa(indexed_pattern(f"(?:{CHAR})*\""))


class _KeyTable:
    """key_dfa's states as rows over the 256 bytes (-1: dies): the start (before the opening
    quote), one per trie node, one per recognizer state where no name character is in reach
    (shared), the left-the-trie loop, the accepting state after a closing quote, and per node
    with non-plain children the recognizer states that can still spell one of them."""

    def __init__(self, names: tuple[str, ...], special: tuple[str, ...], rec: _Recognizer, left: ByteDFA):
        self.rec = rec
        self.special = special  # tag t is special[t - 1]
        self.tag = {c: i + 1 for i, c in enumerate(special)}
        kids: list[dict[str, int]] = [{}]
        is_name = [False]
        for name in names:
            node = 0
            for c in name:
                nxt = kids[node].get(c)
                if nxt is None:
                    nxt = kids[node][c] = len(kids)
                    kids.append({})
                    is_name.append(False)
                node = nxt
            is_name[node] = True
        self.kids, self.is_name = kids, is_name
        self.node0 = 1
        self.rec0 = self.node0 + len(kids)
        self.left0 = self.rec0 + len(rec.next)
        self.accept = self.left0 + len(left.final)
        self.left_start = self.left0 + start_state(left)
        self.left = left
        self.extra: list[np.ndarray] = []  # rows of per-node recognizer states
        self.extra_ids: dict[tuple[int, int], int] = {}

    def _after(self, node: int, kid_mask: int, r: int) -> int:
        """Where the recognizer's state r leads from trie node `node` (kid_mask: the tags of its
        non-plain children)."""
        rec = self.rec
        if r == rec.dead:
            return -1
        t = int(rec.done[r])
        if t >= 0:
            if kid_mask >> t & 1:
                return self.node0 + self.kids[node][self.special[t - 1]]
            return self.left_start
        if not rec.live[r] & kid_mask:
            return self.rec0 + r
        key = (node, r)
        sid = self.extra_ids.get(key)
        if sid is None:
            sid = self.extra_ids[key] = self.accept + 1 + len(self.extra_ids)
            self.extra.append(None)  # reserved; filled below (rows may refer to themselves)
            row = np.array([self._after(node, kid_mask, int(s)) for s in rec.next[r]], dtype=np.int64)
            self.extra[sid - self.accept - 1] = row
        return sid

    def dfa(self) -> ByteDFA:
        rec = self.rec
        shared = np.where(rec.done >= 0, self.left_start, self.rec0 + np.arange(len(rec.next)))
        shared[rec.dead] = -1
        rec_rows = shared[rec.next]
        template = np.full(256, -1, dtype=np.int64)
        template[[ord(c) for c in _RAW]] = self.left_start
        template[ord('"')] = self.accept
        entry = [ord("\\")] + list(range(0x80, 0x100))
        template[entry] = shared[rec.next[rec.start, entry]]
        node_rows = np.repeat(template[None], len(self.kids), axis=0)
        node_rows[np.flatnonzero(self.is_name), ord('"')] = -1
        for node, kids in enumerate(self.kids):
            mask = 0
            for c, child in kids.items():
                if c in _RAW:
                    node_rows[node, ord(c)] = self.node0 + child
                if c not in _PLAIN:
                    mask |= 1 << self.tag[c]
            if mask:
                node_rows[node, entry] = [self._after(node, mask, int(s)) for s in rec.next[rec.start, entry]]
        left = self.left
        left_next = left.trans[:, left.classes].astype(np.int64)
        left_rows = np.where(left_next == left.dead, -1, left_next + self.left0)
        start_row = np.full(256, -1, dtype=np.int64)
        start_row[ord('"')] = self.node0
        rows = np.concatenate([start_row[None], node_rows, rec_rows, left_rows, np.full((1, 256), -1)]
                              + [row[None] for row in self.extra])
        final = np.zeros(len(rows), dtype=bool)
        final[self.left0:self.left0 + len(left.final)] = left.final
        final[self.accept] = True
        return from_table(rows, final, 0)
