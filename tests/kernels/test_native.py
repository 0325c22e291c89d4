"""Loading the native CPU kernels leaves the process's floating point alone."""
import pytest

from gdserve.kernels import native


def test_loading_the_library_keeps_subnormals():
    if native.library() is None:
        pytest.skip("no C compiler")
    smallest_normal = 2.2250738585072014e-308
    assert smallest_normal / 2 > 0.0  # flush-to-zero (gcc's crtfastmath.o with -ffast-math) would give 0.0
