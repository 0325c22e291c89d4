"""Prefix affinity, without Ray: the replica a prefix key belongs to, by rendezvous hashing (a
replica that leaves or joins moves only its own share of the keys), and when its load sends a
request to the least loaded one instead. The Ray Serve router and `gdserve bench throughput
--data-parallel-size` share it."""
import hashlib
from collections.abc import Sequence


def weight(key: int, replica: str) -> int:
    """The key's score at one replica; the highest scoring replica is the key's home."""
    text = f"{key}:{replica}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def home(key: int, replicas: Sequence[str]) -> int:
    """The index of the key's home among the replicas' names."""
    return max(range(len(replicas)), key=lambda i: weight(key, replicas[i]))


def overloaded(home_load: int | None, other_loads: list[int], threshold: int) -> bool:
    """Whether the home replica has more than threshold requests beyond the least loaded other
    (None: its load is not known, so it is not overloaded)."""
    return home_load is not None and bool(other_loads) and home_load - min(other_loads) > threshold
