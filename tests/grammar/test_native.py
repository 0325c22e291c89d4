"""The grammar's native library (grammar/csrc) builds on its own, holds the grammar's C, and
loading it leaves the process's floating point alone."""
import pytest

from gdserve.grammar import native


def test_the_grammar_library_holds_the_grammar_walks():
    lib = native.library()
    if lib is None:
        pytest.skip("no C compiler")
    for name in ("byte_dfa_new", "walk_token_trie", "find_loops", "lexer_product"):
        assert hasattr(lib, name), name
    smallest_normal = 2.2250738585072014e-308
    assert smallest_normal / 2 > 0.0  # flush-to-zero (gcc's crtfastmath.o with -ffast-math) would give 0.0


def test_the_switches_turn_it_off(monkeypatch):
    for switch in ("GDSERVE_NATIVE_GRAMMAR", "GDSERVE_NATIVE_KERNELS"):
        native.library.cache_clear()
        with monkeypatch.context() as m:
            m.setenv(switch, "0")
            assert native.library() is None
    native.library.cache_clear()
