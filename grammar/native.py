"""The grammar's native code: C sources in grammar/csrc (regex_parse.c: a regex's parse;
nfa_build.c: its byte NFA; byte_dfa.c: the NFA's subset construction; token_trie.c: the token-trie
walks of token_index; lexer_product.c: the contextual lexer's product states), built and cached like
the CPU kernels (gdserve.kernels.native). Where no compiler works, or GDSERVE_NATIVE_GRAMMAR=0 (or
GDSERVE_NATIVE_KERNELS=0, all native code off), `library()` returns None and the grammar runs its
numpy and Python walks."""
import ctypes
import os
from functools import cache
from pathlib import Path

from gdserve.kernels.native import build_library

CSRC = Path(__file__).parent / "csrc"


@cache
def library() -> ctypes.CDLL | None:
    if any(os.environ.get(switch, "1") == "0" for switch in ("GDSERVE_NATIVE_GRAMMAR", "GDSERVE_NATIVE_KERNELS")):
        return None
    lib = build_library(CSRC, "libgdserve_grammar.so",
                        no_compiler="gdserve: no C compiler found; the grammar walks in numpy",
                        failed="gdserve: the grammar's native code unavailable ({error}); it walks in numpy")
    if lib is not None:
        _bind(lib)
    return lib


def _bind(lib: ctypes.CDLL) -> None:
    """The C functions' signatures (ctypes would pass every argument as a C int otherwise)."""
    p, i32 = ctypes.c_void_p, ctypes.c_int32
    lib.walk_token_trie.argtypes = [p, i32, i32, p, p, p, i32, p, p, i32, i32, p, p, p, i32, p, p, p, i32, p, p, p,
                                    p, p, p, i32, p, p]
    lib.walk_token_trie.restype = ctypes.c_int64
    lib.walk_token_subtrees.argtypes = [p, i32, i32, p, p, p, p, i32, p, p, i32, i32, p, p, i32, p, p, p, i32, p,
                                        p, p, p, p]
    lib.walk_token_subtrees.restype = ctypes.c_int64
    lib.find_loops.argtypes = [p, i32, i32, p, p, p, i32, i32, i32, i32, i32, i32, i32, p, p, p, p]
    lib.find_loops.restype = i32
    lib.token_distances.argtypes = [p, i32, p, i32, p, p, i32, p, p]
    lib.token_distances.restype = None
    lib.greedy_token_count.argtypes = [p, p, p, p, p, i32, ctypes.c_char_p, ctypes.c_int64]
    lib.greedy_token_count.restype = ctypes.c_int64
    lib.byte_dfa_new.argtypes = [i32, i32, i32, i32, p, p, p, p, p, p, i32]
    lib.byte_dfa_new.restype = p
    lib.byte_dfa_expand_all.argtypes = [p]
    lib.byte_dfa_expand_all.restype = i32
    lib.byte_dfa_states.argtypes = [p]
    lib.byte_dfa_states.restype = i32
    lib.byte_dfa_capacity.argtypes = [p]
    lib.byte_dfa_capacity.restype = i32
    lib.byte_dfa_arrays.argtypes = [p, p, p, p, p, p]
    lib.byte_dfa_arrays.restype = i32
    lib.byte_dfa_expand.argtypes = [p, i32]
    lib.byte_dfa_expand.restype = i32
    lib.byte_dfa_reach.argtypes = [p, i32, i32]
    lib.byte_dfa_reach.restype = i32
    lib.byte_dfa_walk.argtypes = [p, i32, ctypes.c_char_p, ctypes.c_int64, p]
    lib.byte_dfa_walk.restype = i32
    lib.byte_dfa_max_distance.argtypes = [p]
    lib.byte_dfa_max_distance.restype = ctypes.c_int64
    lib.byte_dfa_reaches.argtypes = [p, i32, p]
    lib.byte_dfa_reaches.restype = i32
    lib.lexer_product.argtypes = [i32, p, p, i32, i32, p, p, i32, i32, i32, p, p, p, p, p, p, i32, p,
                                  p, i32, p, p, p, p, p, ctypes.c_int64, ctypes.c_int64]
    lib.lexer_product.restype = ctypes.c_int64
    lib.lexer_product_rehash.argtypes = [p, i32, p, p, p, ctypes.c_int64]
    lib.lexer_product_rehash.restype = None
    lib.lexer_own_rows.argtypes = [p, i32, i32, p, i32, i32, p, i32, i32, i32, i32, p, p, p]
    lib.lexer_own_rows.restype = None
    lib.table_distances.argtypes = [p, i32, i32, p, ctypes.c_int64, p]
    lib.table_distances.restype = i32
    lib.byte_dfa_free.argtypes = [p]
    lib.byte_dfa_free.restype = None
    lib.nfa_build_regex.argtypes = [ctypes.c_char_p, ctypes.c_int64, i32, p, p, p, p]
    lib.nfa_build_regex.restype = p
    lib.regex_expanded_size.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.regex_expanded_size.restype = ctypes.c_int64
    lib.nfa_result.argtypes = [p, p, p, p, p]
    lib.nfa_result.restype = i32
    lib.nfa_csr.argtypes = [p] * 8
    lib.nfa_csr.restype = None
    lib.nfa_free.argtypes = [p]
    lib.nfa_free.restype = None

