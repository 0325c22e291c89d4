"""The constraint compilers `gdserve bench maskbench` scores, behind one small interface.

A Backend compiles a JSON Schema (raising CompileFailed when it cannot) and starts Matchers on the
result; a Matcher fills one int32 bitmask row ([1, ceil(V / 32)], bit i = token i allowed, the
layout of gdserve, llguidance and xgrammar) with the library's own fill, and accepts tokens.

Each peer gets its defaults except where a default departs from JSON Schema semantics; what each
was given is in its `settings` (copied into the bench output).
"""
import json
from pathlib import Path
from typing import Protocol

import torch

from gdserve.kernels.bitmask import bitmask_width

BACKENDS = ("gdserve", "llguidance", "xgrammar", "outlines")
# What each backend needs installed (the peers: `pip install -e '.[bench]'`).
MODULES = {"gdserve": "gdserve.grammar", "llguidance": "llguidance", "xgrammar": "xgrammar",
           "outlines": "outlines_core"}
WARMUP_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


class CompileFailed(Exception):
    """The backend rejected the schema (unsupported or invalid)."""


class Matcher(Protocol):
    def fill(self, bitmask: torch.Tensor) -> None: ...   # writes bitmask[0]
    def accept(self, token_id: int) -> bool: ...         # False: not allowed here


class Backend(Protocol):
    settings: dict

    def compile(self, schema: object) -> object: ...     # raises CompileFailed
    def matcher(self, compiled: object) -> Matcher: ...


def make_backend(name: str, *, vocab_size: int, eos_token_id: int, model_dir: str,
                 lenient: bool = False) -> Backend:
    """Build one backend (in the bench's worker process) and warm it up on a small schema, so the
    first schema's TTFM does not pay for lazy imports."""
    from gdserve.models import load_tokenizer
    tokenizer = load_tokenizer(Path(model_dir))
    if name == "gdserve":
        backend = GdserveBackend(tokenizer, vocab_size, lenient)
    elif name == "llguidance":
        backend = LlguidanceBackend(tokenizer, vocab_size, eos_token_id)
    elif name == "xgrammar":
        backend = XgrammarBackend(tokenizer, vocab_size, eos_token_id)
    elif name == "outlines":
        backend = OutlinesBackend(tokenizer, vocab_size, eos_token_id)
    else:
        raise ValueError(f"unknown backend {name!r}: expected one of {', '.join(BACKENDS)}")
    bitmask = torch.zeros(1, bitmask_width(vocab_size), dtype=torch.int32)
    backend.matcher(backend.compile(WARMUP_SCHEMA)).fill(bitmask)
    return backend


class _Fill:
    """A matcher whose fill and accept are plain callables (the common shape of all four)."""
    __slots__ = ("fill", "accept")

    def __init__(self, fill, accept):
        self.fill, self.accept = fill, accept


class GdserveBackend:
    def __init__(self, tokenizer, vocab_size: int, lenient: bool):
        from gdserve.grammar import GrammarError, compile_grammar
        self._compile, self._error = compile_grammar, GrammarError
        self.tokenizer, self.vocab_size, self.lenient = tokenizer, vocab_size, lenient
        self.settings = {"whitespace": "default (flexible, bounded)",
                         "mode": "lenient (unsupported keywords relaxed)" if lenient
                         else "strict (unsupported keywords are compile errors)",
                         "objects": "open_objects=True (JSON Schema semantics: undeclared keys "
                                    "wherever the schema admits them)"}

    def compile(self, schema: object) -> object:
        try:
            return self._compile("json", schema, self.tokenizer, lenient=self.lenient,
                                 open_objects=True, vocab_size=self.vocab_size)
        except self._error as e:
            raise CompileFailed(str(e)) from None

    def matcher(self, compiled) -> Matcher:
        m = compiled.matcher()
        return _Fill(lambda bm: m.fill_next_token_bitmask(bm, 0), m.accept_token)


class LlguidanceBackend:
    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch
        self._ll, self._fill = llguidance, llguidance.torch.fill_next_token_bitmask
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                      eos_token=eos_token_id)
        self.settings = {"whitespace": r"default (whitespace_flexible: [\x20\x0A\x0D\x09]+)",
                         "mode": "defaults (lenient false, coerce_one_of false)"}

    def compile(self, schema: object) -> object:
        try:
            grammar = self._ll.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        except ValueError as e:
            raise CompileFailed(str(e)) from None
        matcher = self._ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise CompileFailed(matcher.get_error())
        return matcher  # pristine; each instance runs on a copy

    def matcher(self, compiled) -> Matcher:
        m = compiled.deep_copy()
        return _Fill(lambda bm: self._fill(m, bm, 0), m.consume_token)


class XgrammarBackend:
    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int):
        import xgrammar
        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=[eos_token_id])
        # One thread, no cache: the same conditions as the others (MaskBench ran single-threaded).
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.settings = {"whitespace": "default (any_whitespace=True)",
                         "mode": "strict_mode=False (JSON Schema semantics: extra properties and "
                                 "items allowed, MaskBench's 'compliant' XGrammar); any_order=False "
                                 "(default: properties in schema order)",
                         "max_threads": 1}

    def compile(self, schema: object) -> object:
        try:
            return self.compiler.compile_json_schema(json.dumps(schema), strict_mode=False)
        except Exception as e:  # RuntimeError / InvalidJSONError with the converter's message
            raise CompileFailed(f"{type(e).__name__}: {e}") from None

    def matcher(self, compiled) -> Matcher:
        m = self._xgr.GrammarMatcher(compiled)
        return _Fill(lambda bm: m.fill_next_token_bitmask(bm, 0), m.accept_token)


class OutlinesBackend:
    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int):
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema
        from outlines_core.kernels.torch import fill_next_token_bitmask
        self._oc, self._regex = outlines_core, build_regex_from_schema
        self._fill = fill_next_token_bitmask
        self.vocabulary = outlines_core.Vocabulary(eos_token_id,
                                                   byte_level_vocabulary(tokenizer, eos_token_id))
        self.vocab_size = vocab_size
        self.settings = {"whitespace": "default ([ ]?)",
                         "mode": "build_regex_from_schema + Index over the tokens' raw bytes"}

    def compile(self, schema: object) -> object:
        try:
            return self._oc.Index(self._regex(json.dumps(schema)), self.vocabulary)
        except Exception as e:  # TypeError / ValueError / NotImplementedError from the translator
            raise CompileFailed(f"{type(e).__name__}: {e}") from None

    def matcher(self, compiled) -> Matcher:
        guide = self._oc.Guide(compiled)

        def accept(token_id: int) -> bool:
            try:
                guide.advance(token_id, return_tokens=False)
                return True
            except ValueError:
                return False
        return _Fill(lambda bm: self._fill(guide, bm), accept)


def _gpt2_unicode_to_byte() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + k): b for k, b in enumerate(b for b in range(256) if b not in printable)})
    return table


def byte_level_vocabulary(tokenizer, eos_token_id: int) -> dict[bytes, list[int]]:
    """{raw token bytes: [ids]} of a byte-level BPE tokenizer, special tokens and EOS left out
    (outlines-core needs raw bytes; built here independently of gdserve.grammar)."""
    table = _gpt2_unicode_to_byte()
    specials = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items()
                                                 if t.special} | {eos_token_id}
    out: dict[bytes, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id in specials:
            continue
        if any(c not in table for c in token):
            raise ValueError(f"the outlines peer needs a byte-level BPE tokenizer; token {token!r} "
                             "is not in the GPT-2 byte table")
        out.setdefault(bytes(table[c] for c in token), []).append(token_id)
    return out
