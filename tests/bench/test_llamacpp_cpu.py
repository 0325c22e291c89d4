"""scripts/llamacpp_cpu.py without llama.cpp's server: it stops at once and says how to get one."""
import subprocess
import sys

from gdserve.bench.workloads import REPO_ROOT


def test_missing_llama_server_says_how_to_build_it(tmp_path):
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "llamacpp_cpu.py"), "--llama-server",
                           str(tmp_path / "llama-server"), "--output", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "llama.cpp's server is not installed at" in done.stderr and "make llama-server" in done.stderr
    assert not (tmp_path / "out.json").exists()
