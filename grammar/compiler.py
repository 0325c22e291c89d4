r"""compile_grammar: a constraint spec of one kind -> a Grammar over a tokenizer's vocabulary.

regex, choice and json all become a regex, then a lazy token index over the tokens' raw bytes
(token_index: the regex's byte DFA, determinized as states are reached (lazy_dfa), walked with the
vocabulary's token trie when a state is first reached; the same tokens as an outlines-core Index
over the vocabulary would allow).

outlines-core builds its DFA with leftmost-first match semantics: once a higher-priority branch
has matched, the DFA drops the lower ones, so `a|ab` would index only "a" and `a*|b` never "b".
Ending the regex with `\z` keeps every thread alive until the end of input (a full match is
only decided there), which gives the plain language. A regex that can match empty then puts `\z`
at its start, where outlines-core refuses it ("anchored universal start state doesn't exist"), so
the index also starts with a sentinel character (START_TEXT, a noncharacter) and matchers begin
after it.

A compile also checks that some sequence of the vocabulary's tokens reaches an accepting state
(as outlines-core's Index did), so a regex the tokenizer cannot spell fails here, not mid-sequence.
"""
import json
import os
from typing import TYPE_CHECKING

from gdserve.grammar.cfg.grammar import STEER_MARGIN, CfgGrammar
from gdserve.grammar.cfg.lexer import terminal_dfa
from gdserve.grammar.errors import GrammarError, RecursiveSchemaError, RegexTooLargeError
from gdserve.grammar.json.report import enforcement_report
from gdserve.grammar.json.schema import compile_json_schema
from gdserve.grammar.json.schema_cfg import JSON_OBJECT_SCHEMA, schema_to_grammar
from gdserve.grammar.json.unique import UniqueItemsGrammar, with_unique_items
from gdserve.grammar.regex.lazy_dfa import lazy_byte_dfa
from gdserve.grammar.cfg.lark_spec import CfgSpec, lark_to_spec, load_grammar_text
from gdserve.grammar.matcher import Grammar
from gdserve.grammar.regex.syntax import choice_regex, explain_index_error, prepare_regex
from gdserve.grammar.token_index import (TokenIndex, build_byte_dfa, can_reach_final, indexed_pattern, start_state,
                                         token_trie)
from gdserve.grammar.vocabulary import TokenVocabulary, token_vocabulary

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

KINDS = ("json", "regex", "choice", "grammar", "json_object")


def compile_grammar(kind: str, spec: object, tokenizer: "PreTrainedTokenizerBase", *,
                    whitespace_pattern: str | None = None, lenient: bool = False,
                    open_objects: bool = False, vocab_size: int | None = None,
                    eos_token_ids: set[int] | None = None) -> Grammar | CfgGrammar | UniqueItemsGrammar:
    """Compile `spec` of `kind` ("json" | "regex" | "choice" | "grammar" | "json_object") for
    `tokenizer`. A recursive JSON Schema, one whose regex would be too large to index
    (json.schema.MAX_REGEX_CHARS), and json_object (any JSON object, spec ignored) take the grammar
    path (json.schema_cfg); other JSON Schemas a regex.

    whitespace_pattern, lenient, open_objects: json and json_object (see json.schema.schema_to_regex;
        open_objects: undeclared keys wherever JSON Schema admits them, else objects with declared
        properties and no additionalProperties are closed).
    vocab_size: the model's logits width (default len(tokenizer)); ids past the tokenizer are never
        allowed. eos_token_ids: EOS ids beyond the tokenizer's and generation_config's.
    Raises GrammarError.
    """
    return compile_with_vocabulary(kind, spec, token_vocabulary(tokenizer, eos_token_ids),
                                   whitespace_pattern=whitespace_pattern, lenient=lenient,
                                   open_objects=open_objects, vocab_size=vocab_size)


def compile_with_vocabulary(kind: str, spec: object, vocab: TokenVocabulary, *,
                            whitespace_pattern: str | None = None, lenient: bool = False,
                            open_objects: bool = False,
                            vocab_size: int | None = None) -> Grammar | CfgGrammar | UniqueItemsGrammar:
    """compile_grammar on a prepared TokenVocabulary (what the compile workers hold)."""
    vocab_size = vocab.size if vocab_size is None else vocab_size
    if vocab_size < 1:
        raise GrammarError(f"vocab_size must be positive, got {vocab_size}")
    if kind == "grammar":
        return compile_cfg(lark_to_spec(load_grammar_text(spec)), vocab, vocab_size)
    if kind == "json_object":
        return compile_json_cfg(JSON_OBJECT_SCHEMA, vocab, vocab_size, whitespace_pattern, lenient)
    try:
        regex, relaxed, report, unique_items = spec_to_regex(kind, spec, whitespace_pattern, lenient, open_objects)
        index = build_index(regex, vocab)
    except (RecursiveSchemaError, RegexTooLargeError) as no_regex:
        if kind != "json":  # a regex whose automaton is too large: nothing else reads it
            raise
        try:  # each subschema a rule of its own
            return compile_json_cfg(spec, vocab, vocab_size, whitespace_pattern, lenient, open_objects)
        except GrammarError as e:
            if isinstance(no_regex, RecursiveSchemaError):
                raise
            raise GrammarError(f"{no_regex.message}; the grammar path failed too: {e.message}") from None
    eos = frozenset(i for i in vocab.eos_token_ids if i < vocab_size)
    initial_state = start_state(index.dfa)
    if not can_reach_final(index, initial_state):
        raise GrammarError(f"cannot compile regex {regex!r}: the vocabulary is incompatible "
                           "with it (no sequence of its tokens spells a text the regex matches)")
    grammar = Grammar(kind, index, initial_state, vocab_size, eos, regex, relaxed, report).prepare_budgets()
    return with_unique_items(grammar, _parsed(spec), unique_items) if unique_items else grammar


def spec_to_regex(kind: str, spec: object, whitespace_pattern: str | None, lenient: bool,
                  open_objects: bool = False) -> tuple[str, list[str], dict | None, list[str]]:
    """(regex, relaxed JSON-pointer keywords, the enforcement report of a JSON Schema, the
    uniqueItems its matchers keep: json.unique)."""
    if kind == "regex":
        return prepare_regex(spec), [], None, []
    if kind == "choice":
        return choice_regex(spec), [], None, []
    if kind == "json":
        compiled = compile_json_schema(spec, whitespace_pattern, lenient, open_objects=open_objects)
        report = enforcement_report(_parsed(spec), compiled.relaxed, compiled.narrowed)
        return compiled.regex, compiled.relaxed, report, compiled.unique_items
    raise GrammarError(f"unknown constraint kind {kind!r}: expected one of {', '.join(KINDS)}")


def _parsed(schema: object) -> object:
    return json.loads(schema) if isinstance(schema, str) else schema


def compile_cfg(cfg: CfgSpec, vocab: TokenVocabulary, vocab_size: int, kind: str = "grammar",
                relaxed: list[str] | None = None, steer_margin: int = STEER_MARGIN,
                report: dict | None = None) -> CfgGrammar:
    """CfgSpec -> CfgGrammar (the LALR path, see grammar/cfg/grammar.py); its terminal DFAs and the
    first mask and the shortest completion from the start (what steering to completion reads first)
    are built here, in the compile worker; every other mask when a matcher first needs it (a few percent of
    a big lexer's states are ever reached, hard to foresee)."""
    dfas = [terminal_dfa(t) for t in cfg.terminals]
    eos = frozenset(i for i in vocab.eos_token_ids if i < vocab_size)
    grammar = CfgGrammar(kind, cfg, token_trie(vocab.token_bytes, vocab.fingerprint), dfas,
                         vocab_size, eos, relaxed=relaxed or [], steer_margin=steer_margin, report=report)
    grammar.state_mask(grammar.initial)
    grammar.completion(grammar.initial)
    return grammar


def compile_json_cfg(schema: object, vocab: TokenVocabulary, vocab_size: int,
                     whitespace_pattern: str | None, lenient: bool, open_objects: bool = False) -> CfgGrammar:
    """A JSON Schema on the grammar path (recursive schemas, json_object)."""
    compiled = schema_to_grammar(schema, whitespace_pattern, lenient, open_objects=open_objects)
    # one token may commit to an optional part's whole shortest text, maybe two nested (`[{`)
    margin = STEER_MARGIN + 2 * compiled.max_open_bytes
    report = enforcement_report(_parsed(schema), compiled.relaxed, compiled.narrowed)
    grammar = compile_cfg(compiled.spec(), vocab, vocab_size, "json", compiled.relaxed, margin, report)
    if not compiled.unique_items:
        return grammar
    return with_unique_items(grammar, _parsed(schema), compiled.unique_items)


def build_index(regex: str, vocab: TokenVocabulary) -> TokenIndex:
    """The lazy token index of indexed_pattern(regex) over the vocabulary: its DFA built on
    demand (lazy_dfa) where the regex's syntax allows and GDSERVE_LAZY_DFA is not 0, else whole."""
    pattern = indexed_pattern(regex)
    dfa = lazy_byte_dfa(pattern) if os.environ.get("GDSERVE_LAZY_DFA", "1") != "0" else None
    if dfa is None:
        try:
            dfa = build_byte_dfa(pattern)
        except GrammarError:
            raise
        except ValueError as e:
            raise explain_index_error(regex, e) from None
    return TokenIndex(dfa, token_trie(vocab.token_bytes, vocab.fingerprint))
