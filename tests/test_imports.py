"""The package imports one way: no module imports another that (directly or through others)
imports it back, counting imports inside functions too."""
import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"gdserve": ROOT / "gdserve", "gdserve.grammar": ROOT / "grammar",
            "gdserve.kernels": ROOT / "kernels"}


def module_files() -> dict[str, Path]:
    files = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((name, *parts))] = path
    return files


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from pkg import mod` reads the module; `from pkg import name` runs pkg's __init__
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                     else node.module for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known and name != module}
    return found


def test_no_import_cycles():
    files = module_files()
    graph = nx.DiGraph()
    for module, path in files.items():
        graph.add_node(module)
        graph.add_edges_from((module, dep) for dep in imported(module, path, set(files)))
    cycles = list(nx.simple_cycles(graph))
    assert cycles == [], cycles

