"""Constraint compilers (installed as gdserve.grammar): regex, choice, JSON Schema, Lark CFG."""
