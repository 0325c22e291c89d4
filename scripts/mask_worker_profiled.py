"""A mask worker (grammar/matcher_pool.py) under cProfile, for scripts/profile_agents_gpu.py: its
stats go to $MASK_WORKER_PROFILE_DIR/mask_worker_<pid>.prof at most every DUMP_EVERY_S seconds
and when it ends (the pool kills its workers at close, so the last dump may be a few seconds old).
The pool runs it in place of its own module (profile_agents_gpu.py sets matcher_pool.MODULE)."""
import cProfile
import os
import time
from pathlib import Path

from gdserve.grammar import matcher_pool

DUMP_EVERY_S = 1.0


def main(fd: int, parent_pid: int) -> None:
    profile = cProfile.Profile()
    path = Path(os.environ["MASK_WORKER_PROFILE_DIR"]) / f"mask_worker_{os.getpid()}.prof"
    apply, last = matcher_pool._Worker.apply, [time.monotonic()]

    def apply_and_dump(worker, ops: list[tuple]) -> None:
        if time.monotonic() - last[0] > DUMP_EVERY_S:
            profile.dump_stats(path)  # disables the profile
            profile.enable()
            last[0] = time.monotonic()
        apply(worker, ops)

    matcher_pool._Worker.apply = apply_and_dump
    profile.runcall(matcher_pool.main, fd, parent_pid)
    profile.dump_stats(path)
