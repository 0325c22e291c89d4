"""The CPU's native kernels: C sources in kernels/csrc, built with the system compiler on first use
and cached by (source, compiler, CPU) under $GDSERVE_CACHE/kernels. They link the OpenMP runtime
torch has already loaded, so they share its thread pool. Where no compiler works, `library()`
returns None and callers keep the torch reference. `build_library` builds and loads any such
folder of C sources the same way (the grammar's own, gdserve.grammar.native)."""
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from functools import cache
from pathlib import Path

import torch

_CSRC = Path(__file__).parent / "csrc"
# -ffast-math's parts that let reductions vectorize, not -ffast-math itself: with it gcc links
# crtfastmath.o, which turns on flush-to-zero for the whole process that loads the library.
_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
          "-fassociative-math", "-freciprocal-math", "-ffinite-math-only", "-fopenmp", "-shared", "-fPIC",
          "-std=c11"]


def _cache_dir() -> Path:
    root = Path(os.environ.get("GDSERVE_CACHE") or Path.home() / ".cache" / "gdserve")
    return root / "kernels"


def _cpu_signature() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


def _build_key(compiler: str, csrc: Path, flags: list[str]) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    files = sorted(csrc.iterdir())
    for part in [version, _cpu_signature(), " ".join(flags), *(f.read_text() for f in files)]:
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def _build(compiler: str, flags: list[str], sources: list[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [compiler, *flags, *map(str, sources), "-o", str(out), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        os.replace(out, target)  # atomic: concurrent builders agree on one file


def build_library(csrc: Path, name: str, extra_flags: tuple[str, ...] = (), *, no_compiler: str,
                  failed: str) -> ctypes.CDLL | None:
    """The shared library `name` built from csrc/*.c (with _FLAGS and extra_flags) and loaded, cached
    by (sources, compiler, flags, CPU) under $GDSERVE_CACHE/kernels. None off Linux, and with a
    warning where no compiler is found (`no_compiler`) or the build or load fails (`failed`, its
    `{error}` filled in)."""
    if sys.platform != "linux":
        return None
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        warnings.warn(no_compiler)
        return None
    flags = [*_FLAGS, *extra_flags]
    try:
        target = _cache_dir() / _build_key(compiler, csrc, flags) / name
        if not target.exists():
            _build(compiler, flags, sorted(csrc.glob("*.c")), target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as e:
        warnings.warn(failed.format(error=e))
        return None


@cache
def library() -> ctypes.CDLL | None:
    if os.environ.get("GDSERVE_NATIVE_KERNELS", "1") == "0":
        return None
    return build_library(_CSRC, "libgdserve_cpu.so",
                         no_compiler="gdserve: no C compiler found; CPU attention uses the torch reference",
                         failed="gdserve: native CPU kernels unavailable ({error}); using the torch reference")


_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


_CACHE_SUFFIX = {torch.float8_e4m3fn: "_e4m3", torch.float8_e5m2: "_e5m2"}


def kernel(name: str, like: torch.Tensor, cache: torch.dtype | None = None):
    """The native `name_{f32,bf16}` for tensors like `like` (with `_{e4m3,e5m2}` for an fp8
    `cache` type), or None where the torch reference must run (not on the CPU, another dtype,
    no compiler)."""
    if like.device.type != "cpu" or like.dtype not in _SUFFIX:
        return None
    if cache not in (None, like.dtype, *_CACHE_SUFFIX):
        return None
    lib = library()
    suffix = _SUFFIX[like.dtype] + _CACHE_SUFFIX.get(cache, "")
    return None if lib is None else getattr(lib, f"{name}_{suffix}")


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())
