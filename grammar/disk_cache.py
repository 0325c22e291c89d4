"""Compiled grammars on disk, so that a restarted server does not recompile the constraints it has
seen. One pickle per compile key (constraint, options, tokenizer), in a folder named by a
fingerprint of the compiler's own source and of outlines-core's version: a changed compiler never
reads an older one's grammars. Files are written whole (a temp file, then a rename) by one
background thread; a file that fails to load is removed and the constraint compiled again.
The files are pickles: point it only at a folder that no one else writes."""
import hashlib
import importlib.metadata
import os
import pickle
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path


@cache
def compiler_fingerprint() -> str:
    digest = hashlib.sha256(importlib.metadata.version("outlines_core").encode())
    root = Path(__file__).parent
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.lark")]):
        digest.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:16]


class DiskCache:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory) / compiler_fingerprint()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="grammar-disk-cache")

    def _path(self, key: tuple) -> Path:
        return self.dir / f"{hashlib.sha256(repr(key).encode()).hexdigest()}.pkl"

    def get(self, key: tuple):
        """The grammar stored under key, or None."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001  (truncated or from an incompatible build: compile again)
            path.unlink(missing_ok=True)
            return None

    def put(self, key: tuple, grammar) -> None:
        """Store in the background; a failed write only costs a later recompile."""
        self._writer.submit(self._write, self._path(key), grammar)

    def _write(self, path: Path, grammar) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(grammar, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except Exception:  # noqa: BLE001
            Path(tmp).unlink(missing_ok=True)

    def close(self) -> None:
        """Finish the pending writes."""
        self._writer.shutdown(wait=True)
