"""Context-free grammars (kind "grammar"): Lark and GBNF text read into a spec, its LALR(1)
tables, the contextual lexer over byte DFAs, and the compiled grammar whose matcher follows the
parser's configurations and fills token masks. The built-in grammars (`builtin:NAME`) are the
*.lark files here."""
