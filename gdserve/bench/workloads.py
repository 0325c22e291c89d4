"""Finds and imports the standard workloads (../shared/bench/workload.py beside the repo)."""
import importlib.util
import os
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_dir() -> Path:
    """`$GDSERVE_SHARED`, else the `shared/` folder beside the repository."""
    return Path(os.environ.get("GDSERVE_SHARED", REPO_ROOT.parent / "shared"))


def load_workload_module() -> ModuleType:
    path = shared_dir() / "bench" / "workload.py"
    if not path.exists():
        raise ValueError(f"the standard workloads are not at {path}; set GDSERVE_SHARED to the "
                         "folder that holds bench/workload.py")
    spec = importlib.util.spec_from_file_location("gdserve_shared_workload", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
