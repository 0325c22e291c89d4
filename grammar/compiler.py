r"""compile_grammar: a constraint spec of one kind -> a Grammar over a tokenizer's vocabulary.

regex, choice and json all become a regex, then an outlines-core Index over the tokens' raw bytes.

outlines-core builds its DFA with leftmost-first match semantics: once a higher-priority branch
has matched, the DFA drops the lower ones, so `a|ab` would index only "a" and `a*|b` never "b".
Ending the regex with `\z` keeps every thread alive until the end of input (a full match is
only decided there), which gives the plain language. A regex that can match empty then puts `\z`
at its start, where outlines-core refuses it ("anchored universal start state doesn't exist"), so
the index also starts with a sentinel character read by a token of our own (START_TOKEN_ID, past
every real id: never allowed, never accepted) and matchers begin after it.
"""
from typing import TYPE_CHECKING

from outlines_core import Index

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json_schema import schema_to_regex
from gdserve.grammar.matcher import Grammar
from gdserve.grammar.regex import choice_regex, explain_index_error, prepare_regex
from gdserve.grammar.vocabulary import (START_TEXT, START_TOKEN_ID, TokenVocabulary,
                                        token_vocabulary)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

KINDS = ("json", "regex", "choice", "grammar")


def compile_grammar(kind: str, spec: object, tokenizer: "PreTrainedTokenizerBase", *,
                    whitespace_pattern: str | None = None, lenient: bool = False,
                    vocab_size: int | None = None,
                    eos_token_ids: set[int] | None = None) -> Grammar:
    """Compile `spec` of `kind` ("json" | "regex" | "choice" | "grammar") for `tokenizer`.

    whitespace_pattern, lenient: json only (see json_schema.schema_to_regex).
    vocab_size: the model's logits width (default len(tokenizer)); ids past the tokenizer are never
        allowed. eos_token_ids: EOS ids beyond the tokenizer's and generation_config's.
    Raises GrammarError.
    """
    return compile_with_vocabulary(kind, spec, token_vocabulary(tokenizer, eos_token_ids),
                                   whitespace_pattern=whitespace_pattern, lenient=lenient,
                                   vocab_size=vocab_size)


def compile_with_vocabulary(kind: str, spec: object, vocab: TokenVocabulary, *,
                            whitespace_pattern: str | None = None, lenient: bool = False,
                            vocab_size: int | None = None) -> Grammar:
    """compile_grammar on a prepared TokenVocabulary (what the compile workers hold)."""
    vocab_size = vocab.size if vocab_size is None else vocab_size
    if vocab_size < 1:
        raise GrammarError(f"vocab_size must be positive, got {vocab_size}")
    regex, relaxed = spec_to_regex(kind, spec, whitespace_pattern, lenient)
    eos = frozenset(i for i in vocab.eos_token_ids if i < vocab_size)
    index = build_index(regex, vocab)
    initial_state = index.get_next_state(index.get_initial_state(), START_TOKEN_ID)
    return Grammar(kind, index, initial_state, vocab_size, eos, regex, relaxed)


def spec_to_regex(kind: str, spec: object, whitespace_pattern: str | None,
                  lenient: bool) -> tuple[str, list[str]]:
    """(regex, relaxed JSON-pointer keywords) for a spec of `kind`."""
    if kind == "regex":
        return prepare_regex(spec), []
    if kind == "choice":
        return choice_regex(spec), []
    if kind == "json":
        return schema_to_regex(spec, whitespace_pattern=whitespace_pattern, lenient=lenient)
    if kind == "grammar":
        raise GrammarError("guided_grammar (Lark) is not supported yet")
    raise GrammarError(f"unknown constraint kind {kind!r}: expected one of {', '.join(KINDS)}")


def build_index(regex: str, vocab: TokenVocabulary) -> Index:
    """The index of START_TEXT + regex, matched in full (see the module docstring)."""
    start = "\\x{%X}" % ord(START_TEXT)
    try:
        return Index(f"{start}(?:{regex})\\z", vocab.outlines_vocabulary())
    except ValueError as e:
        raise explain_index_error(regex, e) from None
