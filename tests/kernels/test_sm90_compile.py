"""Every Triton kernel of the GPU path compiles for the H200 (sm_90), checked here without a GPU
(sm90_compile.py, in a process of its own: this one runs triton under the interpreter). On a
CUDA machine the kernel tests compile them for real, so this is skipped there."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.sm90_compile import CASES
from tests.kernels.triton_cases import ON_CUDA, requires_triton

pytestmark = [requires_triton, pytest.mark.skipif(ON_CUDA, reason="the kernel tests compile for this GPU")]
SCRIPT = Path(__file__).with_name("sm90_compile.py")


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=1800)
    results = {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}
    return {"results": results, "stderr": proc.stderr[-3000:], "returncode": proc.returncode}


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_compiles_for_sm90(compiled, case):
    result = compiled["results"].get(case)
    assert result is not None, f"{SCRIPT.name} exited {compiled['returncode']} before {case}: {compiled['stderr']}"
    assert result["ok"], result["error"]
