"""Without a GPU, the Triton kernels run under the interpreter. Triton reads TRITON_INTERPRET when
it is first imported (its own jit helpers are built then), and libraries the tests use import it
(peft does), so the root conftest.py calls `use_interpreter_without_cuda()` before any test module
is collected. Processes that tests start later inherit the setting, which is harmless: nothing on
the CPU path uses triton."""
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


def _patch_interpreter_fp8_downcast() -> None:
    """The interpreter's float downcast drops the carry when rounding overflows the mantissa
    (31.7 -> fp8e4nv gives 16, not 32) and rounds ties away from zero (triton-lang/triton#8322;
    fixed upstream by #11897, not in a release yet). The GPU converts with the hardware's
    round-to-nearest-even; convert to fp8 here with torch, which does the same."""
    import numpy as np
    from triton.runtime import interpreter

    convert = interpreter._convert_float
    if getattr(convert, "_gdserve_fixed", False):
        return
    fp8 = {"fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2}
    wide = {"fp32": (np.int32, torch.float32), "fp16": (np.int16, torch.float16), "bf16": (np.int16, torch.bfloat16)}

    def fixed(input, input_dtype, output_dtype, rounding_mode):
        if output_dtype.name not in fp8 or input_dtype.name not in wide:
            return convert(input, input_dtype, output_dtype, rounding_mode)
        bits, dtype = wide[input_dtype.name]
        values = torch.from_numpy(np.frombuffer(input.tobytes(), dtype=bits).copy()).view(dtype)
        return values.to(fp8[output_dtype.name]).view(torch.uint8).numpy().reshape(input.shape)

    fixed._gdserve_fixed = True
    interpreter._convert_float = fixed


def _patch_interpreter_bf16_dot() -> None:
    """The interpreter keeps bfloat16 as its raw uint16 bits, and its tl.dot multiplies those bits
    as integers. Widen bfloat16 operands to float32 first (exact), as the tensor cores multiply."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    create_dot = builder.create_dot
    if getattr(create_dot, "_gdserve_fixed", False):
        return

    def widened(operand):
        if operand.dtype.scalar != interpreter.tl.bfloat16:
            return operand
        data = interpreter._convert_float(operand.data, operand.dtype.scalar, interpreter.tl.float32, None)
        return interpreter.TensorHandle(data.view("float32"), interpreter.tl.float32)

    def fixed(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    fixed._gdserve_fixed = True
    builder.create_dot = fixed


def use_interpreter_without_cuda() -> None:
    if not torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        _patch_interpreter_for_numpy_2_4()
        _patch_interpreter_fp8_downcast()
        _patch_interpreter_bf16_dot()
