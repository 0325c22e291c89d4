"""A dict with a size bound, for the memo tables of the compilers and matchers."""
from __future__ import annotations

from typing import Literal, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(dict[K, V]):
    """At most max_size entries, stored with put(), by one of two policies:

    - "clear": a put of a new key into a full cache empties it first. No bookkeeping on hits, so
      for memo tables on hot paths, whose working set usually fits (what was dropped is computed
      again on its next miss).
    - "lru": a put drops the least recently used entries past max_size; lookup() refreshes a hit.

    Everything else is a plain dict's (get(), `in`, `cache[key] = value` unbounded, pickling).
    """

    def __init__(self, max_size: int, policy: Literal["clear", "lru"] = "clear"):
        super().__init__()
        self.max_size = max_size
        self.policy = policy

    def lookup(self, key: K, default: V | None = None) -> V | None:
        """get(), and under "lru" the key becomes the most recently used."""
        if self.policy == "lru" and key in self:
            self[key] = self.pop(key)
        return self.get(key, default)

    def put(self, key: K, value: V) -> V:
        """Store value (the most recently used under "lru") and return it."""
        if self.policy == "lru":
            self.pop(key, None)
            self[key] = value
            while len(self) > self.max_size:
                del self[next(iter(self))]
        else:
            if key not in self and len(self) >= self.max_size:
                self.clear()
            self[key] = value
        return value
