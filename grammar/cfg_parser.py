"""The LALR(1) parser of a CfgSpec, run on immutable stacks (tuples of states) so a matcher can keep
one per accepted token and a mask can be cached by the stack. Same moves as lark's
ParserState.feed_token: reduce until the terminal shifts; `$END` reduces until the end state."""
from dataclasses import dataclass, field

from gdserve.grammar.lalr import END
from gdserve.grammar.lark_spec import CfgSpec

Stack = tuple[int, ...]
MAX_CACHED = 200_000  # feeds cached per grammar before the cache starts over


@dataclass(eq=False)
class LalrParser:
    spec: CfgSpec
    _feeds: dict[tuple[Stack, str], Stack | None] = field(default_factory=dict, repr=False)

    @property
    def initial(self) -> Stack:
        return (self.spec.start_state,)

    def feed(self, stack: Stack, terminal: str) -> Stack | None:
        """The stack after shifting `terminal` (reductions first), or None: a syntax error."""
        key = (stack, terminal)
        out = self._feeds.get(key, False)
        if out is False:
            if len(self._feeds) > MAX_CACHED:
                self._feeds.clear()
            out = self._feeds[key] = self._feed(stack, terminal)
        return out

    def _feed(self, stack: Stack, terminal: str) -> Stack | None:
        actions = self.spec.actions
        while True:
            act = actions[stack[-1]].get(terminal)
            if act is None:
                return None
            shift, arg = act
            if shift:
                return stack + (arg,)
            origin, size = arg
            if size:
                stack = stack[:-size]
            stack = stack + (actions[stack[-1]][origin][1],)
            if terminal == END and stack[-1] == self.spec.end_state:
                return stack

    def accepts_end(self, stack: Stack) -> bool:
        return self.feed(stack, END) is not None

    def acceptable(self, stack: Stack) -> frozenset[int]:
        """Terminal ids the parser can take next (each checked through its reductions)."""
        ids = self.spec.terminal_ids
        return frozenset(ids[name] for name in self.spec.actions[stack[-1]]
                         if name in ids and self.feed(stack, name) is not None)
