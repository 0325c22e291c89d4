"""The raw bytes of every token of a tokenizer, its EOS and special ids, a fingerprint for caches,
and the outlines-core `Vocabulary` built from them.

Token strings are not text: byte-level BPE (GPT-2, Llama 3, SmolLM2) spells each byte as a
printable character (`Ġ` = space, `Ċ` = newline), and SentencePiece spells a space as `▁` and
unknown bytes as `<0xNN>` byte-fallback tokens. A constraint matches bytes, so we undo both spellings. Special tokens
and EOS are left out of the byte table: they are never allowed inside constrained text (EOS is
allowed only where the constraint accepts, by the matcher).

A `TokenVocabulary` is cached per tokenizer object (and extra EOS set); a tokenizer mutated after
its first use (tokens added) is not noticed.
"""
from __future__ import annotations

import hashlib
import json
import re
import weakref
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from outlines_core import Vocabulary

from gdserve.grammar.errors import GrammarError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# A token of our own in every outlines Vocabulary, far past any real id: each index starts by
# reading it (see compiler.build_index).
START_TOKEN_ID = 2**32 - 2
START_TEXT = "\U0010FFFF"  # a noncharacter, never in text


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 bytes
    to chr(256 + k) in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in printable]
    table.update({chr(256 + k): b for k, b in enumerate(others)})
    return table


UNICODE_TO_BYTE = _gpt2_unicode_to_byte()


@dataclass(frozen=True)
class TokenSpelling:
    """How a tokenizer's token strings spell bytes."""
    byte_level: bool            # GPT-2 byte-to-unicode table
    space_marker: str | None    # SentencePiece's "▁" for a space
    byte_fallback: bool         # "<0xNN>" tokens stand for one byte

    def to_bytes(self, token: str) -> bytes:
        if self.byte_level:
            try:
                return bytes(UNICODE_TO_BYTE[c] for c in token)
            except KeyError:  # a char outside the table stands for itself, as in the HF decoder
                return b"".join(bytes([UNICODE_TO_BYTE[c]]) if c in UNICODE_TO_BYTE else c.encode()
                                for c in token)
        if self.byte_fallback and (m := BYTE_FALLBACK.fullmatch(token)):
            return bytes([int(m.group(1), 16)])
        if self.space_marker:
            token = token.replace(self.space_marker, " ")
        return token.encode("utf-8")


def _decoder_steps(decoder: dict | None) -> list[dict]:
    if decoder is None:
        return []
    if decoder["type"] == "Sequence":
        return [step for d in decoder["decoders"] for step in _decoder_steps(d)]
    return [decoder]


def detect_spelling(tokenizer: PreTrainedTokenizerBase) -> TokenSpelling:
    """From the decoder of a fast tokenizer; for a slow one, from the tokens themselves."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        vocab = tokenizer.get_vocab()
        marker = "▁" if any(t.startswith("▁") for t in vocab) else None
        return TokenSpelling(byte_level=marker is None and any("Ġ" in t for t in vocab),
                             space_marker=marker, byte_fallback="<0x00>" in vocab)
    steps = _decoder_steps(json.loads(backend.to_str()).get("decoder"))
    types = {s["type"] for s in steps}
    marker = next((s.get("replacement", "▁") for s in steps if s["type"] == "Metaspace"), None)
    marker = marker or next((s["pattern"]["String"] for s in steps if s["type"] == "Replace"
                             and s["content"] == " " and "String" in s["pattern"]), None)
    return TokenSpelling(byte_level="ByteLevel" in types, space_marker=marker,
                         byte_fallback="ByteFallback" in types)


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """all_special_ids plus every added token marked special."""
    added = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return frozenset(tokenizer.all_special_ids) | added


def eos_token_ids_of(tokenizer: PreTrainedTokenizerBase, extra: set[int] | None) -> frozenset[int]:
    """The tokenizer's EOS, generation_config.json's eos_token_id when the tokenizer was loaded from
    a model dir, and `extra` (the engine passes the model's full set)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    ids.update(_generation_config_eos(tokenizer.name_or_path))
    ids.update(extra or ())
    if not ids:
        raise GrammarError("the tokenizer has no EOS token: pass eos_token_ids")
    return frozenset(ids)


def _generation_config_eos(model_dir: str | None) -> list[int]:
    gen_file = Path(model_dir) / "generation_config.json" if model_dir else None
    if gen_file is None or not gen_file.is_file():
        return []
    eos = json.loads(gen_file.read_text()).get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


def _token_bytes(tokenizer: PreTrainedTokenizerBase,
                 excluded: frozenset[int]) -> list[bytes | None]:
    spelling = detect_spelling(tokenizer)
    added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    out: list[bytes | None] = []
    for token_id, token in enumerate(tokens):
        if token_id in excluded or token is None:
            out.append(None)
        elif token_id in added:  # added tokens hold their raw text, not a spelling
            out.append(added[token_id].encode("utf-8"))
        else:
            out.append(spelling.to_bytes(token))
    return [b or None for b in out]


@dataclass(frozen=True)
class TokenVocabulary:
    """Raw bytes per token id (None: never inside constrained text: special, EOS, empty, unused)."""
    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: frozenset[int]
    special_token_ids: frozenset[int]

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    @cached_property
    def fingerprint(self) -> str:
        """Stable across processes and runs: sha256 of the bytes table, EOS and special ids."""
        h = hashlib.sha256()
        h.update(b"".join(b"\xff\xff\xff\xff" if b is None else len(b).to_bytes(4, "little") + b
                          for b in self.token_bytes))
        h.update(repr((sorted(self.eos_token_ids), sorted(self.special_token_ids))).encode())
        return h.hexdigest()[:32]

    def outlines_vocabulary(self) -> Vocabulary:
        vocab = _OUTLINES_VOCABULARIES.get(self.fingerprint)
        if vocab is None:
            vocab = _OUTLINES_VOCABULARIES[self.fingerprint] = self._build_outlines_vocabulary()
        return vocab

    def _build_outlines_vocabulary(self) -> Vocabulary:
        ids_by_bytes: dict[bytes, list[int]] = {}
        for token_id, b in enumerate(self.token_bytes):
            if b is not None:
                ids_by_bytes.setdefault(b, []).append(token_id)
        ids_by_bytes.setdefault(START_TEXT.encode(), []).append(START_TOKEN_ID)
        return Vocabulary(min(self.eos_token_ids), ids_by_bytes)


# One outlines Vocabulary per tokenizer fingerprint per process (few tokenizers live in a process).
_OUTLINES_VOCABULARIES: dict[str, Vocabulary] = {}
_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {eos: vocab}


def token_vocabulary(tokenizer: PreTrainedTokenizerBase,
                     eos_token_ids: set[int] | None = None) -> TokenVocabulary:
    """The TokenVocabulary of `tokenizer` (cached per tokenizer and extra EOS set)."""
    per_tokenizer = _VOCABULARIES.setdefault(tokenizer, {})
    key = frozenset(eos_token_ids or ())
    if key not in per_tokenizer:
        eos = eos_token_ids_of(tokenizer, eos_token_ids)
        specials = special_token_ids(tokenizer)
        per_tokenizer[key] = TokenVocabulary(tuple(_token_bytes(tokenizer, eos | specials)),
                                             eos, specials)
    return per_tokenizer[key]
