"""A dataset file read, or refused in one line that names it."""
import json
from pathlib import Path
from typing import Any


def read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror})") from None


def parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
