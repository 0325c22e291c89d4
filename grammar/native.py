"""The grammar's native code: C sources in grammar/csrc (nfa_build.c: a regex's byte NFA from its
parse; byte_dfa.c: the NFA's subset construction; token_trie.c: the token-trie walks of
token_index; lexer_product.c: the contextual lexer's product states), built and cached like the CPU kernels (gdserve.kernels.native). Where no
compiler works, or GDSERVE_NATIVE_GRAMMAR=0 (or GDSERVE_NATIVE_KERNELS=0, all native code off),
`library()` returns None and the grammar runs its numpy and Python walks."""
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
    return build_library(CSRC, "libgdserve_grammar.so",
                         no_compiler="gdserve: no C compiler found; the grammar walks in numpy",
                         failed="gdserve: the grammar's native code unavailable ({error}); it walks in numpy")
