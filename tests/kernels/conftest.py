"""Without a GPU, the Triton kernels run here under the interpreter. Triton reads TRITON_INTERPRET
when it is first imported (its own jit helpers are built then), so it is set here, during
collection, before any test module of this folder imports triton; nothing collected earlier in
the suite imports it. Processes that tests start later inherit the setting, which is harmless:
nothing on the CPU path uses triton."""
import importlib.util
import os

import torch


def _patch_interpreter_for_numpy_2_4() -> None:
    """triton < 3.7's interpreter turns a scalar into a Python int with int(array of shape (1,)),
    which numpy >= 2.4 refuses (triton-lang/triton#9171), so `range(start, end)` over runtime
    bounds fails. The upstream fix (#9172) squeezes the array first; do the same."""
    from triton.runtime import interpreter

    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "_gdserve_fixed", False):
        return

    def fixed(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    fixed._gdserve_fixed = True
    interpreter._patch_lang_tensor = fixed


if not torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _patch_interpreter_for_numpy_2_4()
