"""A grammar whose first row needs many units of new work, for the tests of how a step bounds
mask work (grammar/allowance.py). A module of its own so that mask workers can unpickle it."""
import time

from gdserve.grammar.allowance import unit_of_work

UNIT_S = 0.005


class SlowRowGrammar:
    """A compiled grammar whose matcher needs `units` units of new work (UNIT_S each, progress
    kept: each a unit_of_work) before its first row."""

    def __init__(self, grammar, units: int):
        self.grammar, self.units, self.units_done = grammar, units, 0

    def matcher(self):
        return SlowRowMatcher(self)


class SlowRowMatcher:
    def __init__(self, slow: SlowRowGrammar):
        self.slow, self.inner = slow, slow.grammar.matcher()

    def next_token_row(self, budget=None):
        while self.slow.units_done < self.slow.units:
            with unit_of_work():
                time.sleep(UNIT_S)
                self.slow.units_done += 1
        return self.inner.next_token_row(budget)

    def __getattr__(self, name):
        return getattr(self.inner, name)
