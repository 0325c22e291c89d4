"""Constraint compilers (installed as gdserve.grammar): regex, choice, JSON Schema, Lark CFG.

    g = compile_grammar(kind, spec, tokenizer)      # "json" | "regex" | "choice" | "grammar"
    m = g.matcher()                                 # one per sequence
    bm = allocate_token_bitmask(batch, vocab_size)  # int32 [batch, ceil(V / 32)]
    m.fill_next_token_bitmask(bm, row); m.accept_token(token_id); m.is_terminated(); m.rollback(n)

CompileService (gdserve.grammar.service) compiles off the caller's thread, bounded and cached.

"Grammar" names four things, told apart so: this package (every constraint compiler); the class
Grammar (matcher.py), a constraint compiled to a regex and its token index (regex, choice, most
JSON Schemas), whose name the engine also uses for any compiled constraint; the kind "grammar"
(Lark or GBNF text, compiled to a CfgGrammar, cfg/grammar.py); and `gdserve bench grammar`, which
benchmarks that kind (gdserve/bench/lark_grammars.py). The package, the kind and the exported
class keep their names: outside harnesses use them (DESIGN.md, "The grammar contract").
"""
from gdserve.grammar.compiler import compile_grammar
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.matcher import Grammar, Matcher
from gdserve.kernels.bitmask import allocate_token_bitmask

__all__ = ["compile_grammar", "allocate_token_bitmask", "GrammarError", "Grammar", "Matcher"]
