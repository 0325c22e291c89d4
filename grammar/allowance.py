"""A time allowance for mask work, so that the engine's step never waits long on one sequence's
matcher. Grammars call `checkpoint()` before each unit of work whose result they cache (one state's
row, one walk of the token trie, one completion search). Inside `allowing(allowance)`, a
checkpoint past the allowance's deadline raises MaskPending once a unit has run since the
caller's last `allowance.next_row()`: every row of a step gets a unit, and more while the step's
allowance lasts. The caller retries later and finds the finished units cached. Outside (compile
workers, accept_token, direct users of the matchers) a checkpoint does nothing."""
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class MaskPending(Exception):
    """The row needs more work than the allowance leaves; the work done so far stays cached."""


@dataclass
class Allowance:
    deadline: float      # time.perf_counter() past which no row starts a second unit
    num_units: int = 0   # units started for the current row

    @classmethod
    def of(cls, seconds: float) -> "Allowance":
        return cls(time.perf_counter() + seconds)

    def next_row(self) -> None:
        """The next row's first unit runs whatever the time."""
        self.num_units = 0


_local = threading.local()


@contextmanager
def allowing(allowance: Allowance) -> Iterator[None]:
    """Bound by `allowance` the mask work done on this thread inside the block."""
    outer = getattr(_local, "allowance", None)
    _local.allowance = allowance
    try:
        yield
    finally:
        _local.allowance = outer


def checkpoint() -> None:
    """Call before a unit of mask work: raises MaskPending when the allowance is spent."""
    allowance = getattr(_local, "allowance", None)
    if allowance is None:
        return
    if allowance.num_units and time.perf_counter() > allowance.deadline:
        raise MaskPending
    allowance.num_units += 1
