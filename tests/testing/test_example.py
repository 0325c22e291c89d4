"""examples/conformance runs as users run it (its own pytest process), here on the tiny model."""
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "conformance"


def test_conformance_example_suite(tiny_args):
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", str(EXAMPLE), *tiny_args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout
