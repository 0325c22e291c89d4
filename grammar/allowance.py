"""A time allowance for mask work, so that the engine's step never waits long on one sequence's
matcher. Grammars do each unit of work whose result they cache (one state's row, one walk of the
token trie, one completion search) inside `with unit_of_work():`. Inside `allowing(allowance)`, a
unit about to start past the allowance's deadline raises MaskPending once a unit has completed
since the caller's last `allowance.next_row()`: every row of a step completes a unit, and more
while the step's allowance lasts. The caller retries later and finds the finished units cached.

Units nest (a state's row reads its lexer state's walk): counting completed units, not started
ones, makes every retry finish at least the innermost unit it reaches, so a row that needs many
nested units gets there however little time each step leaves it. Outside `allowing` (compile
workers, accept_token, direct users of the matchers) units are never interrupted.

A mask worker (grammar/matcher_pool.py) goes on with its parked rows between the engine's messages
under an Interruptible allowance: there no unit starts once a message waits, not even a row's first.
"""
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class MaskPending(Exception):
    """The row needs more work than the allowance leaves; the work done so far stays cached."""


@dataclass
class Allowance:
    deadline: float      # time.perf_counter() past which no row starts a unit beyond its first
    num_done: int = 0    # units completed for the current row

    @classmethod
    def of(cls, seconds: float) -> "Allowance":
        return cls(time.perf_counter() + seconds)

    def next_row(self) -> None:
        """The next row completes its first unit whatever the time."""
        self.num_done = 0

    def spent(self) -> bool:
        """Whether the next unit may not start."""
        return self.num_done > 0 and time.perf_counter() > self.deadline


@dataclass
class Interruptible(Allowance):
    """Work done while nothing waits for it: no unit starts once `interrupted()` is true."""
    interrupted: Callable[[], bool] = lambda: False

    def spent(self) -> bool:
        return self.interrupted()


_local = threading.local()


class allowing:
    """`with allowing(allowance):` bounds by `allowance` the mask work done on this thread inside
    the block. A class, not a generator: the engine enters one per guided token."""

    def __init__(self, allowance: Allowance):
        self.allowance = allowance
        self.outer = None

    def __enter__(self) -> None:
        self.outer = getattr(_local, "allowance", None)
        _local.allowance = self.allowance

    def __exit__(self, *exc) -> None:
        _local.allowance = self.outer


@contextmanager
def unit_of_work() -> Iterator[None]:
    """Wrap a unit of mask work whose result is cached: raises MaskPending before it starts when
    the allowance is spent and the row has completed a unit already."""
    allowance = getattr(_local, "allowance", None)
    if allowance is not None and allowance.spent():
        raise MaskPending
    yield
    if allowance is not None:
        allowance.num_done += 1
