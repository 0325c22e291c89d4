"""pyproject.toml lists its packages one by one: every package folder of the source tree must be
among them, or an installed gdserve (not an editable one) lacks it."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *parts)))
    assert found - listed == set(), "package folders missing from pyproject.toml's packages"
