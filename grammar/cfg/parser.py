"""The LALR(1) parser of a CfgSpec, run on immutable stacks (tuples of states) so a matcher can keep
one per accepted token and a mask can be cached by the stack. Same moves as lark's
ParserState.feed_token: reduce until the terminal shifts; `$END` reduces until the end state.
An exact spec's conflicts (lalr.py) are followed every way: a feed gives every stack it can
reach (most often one, none on a syntax error)."""
from dataclasses import dataclass, field

from gdserve.grammar.bounded_cache import BoundedCache
from gdserve.grammar.cfg.lalr import END, Action
from gdserve.grammar.cfg.lark_spec import CfgSpec

Stack = tuple[int, ...]
MAX_CACHED = 200_000  # feeds cached per grammar before the cache starts over
MAX_REDUCTIONS = 10_000  # reductions one feed may try (empty rules in a conflict could go on)


@dataclass(eq=False)
class LalrParser:
    spec: CfgSpec
    _feeds: BoundedCache[tuple[Stack, str], tuple[Stack, ...]] = field(
        default_factory=lambda: BoundedCache(MAX_CACHED), repr=False)
    _acceptable: BoundedCache[Stack, frozenset[int]] = field(
        default_factory=lambda: BoundedCache(MAX_CACHED), repr=False)  # by the top read
    _read_depths: dict[int, set[int]] = field(default_factory=dict, repr=False)  # top state -> those tops' sizes

    @property
    def initial(self) -> Stack:
        return (self.spec.start_state,)

    def feed(self, stack: Stack, terminal: str) -> tuple[Stack, ...]:
        """The stacks after shifting `terminal` (reductions first); none: a syntax error."""
        key = (stack, terminal)
        out = self._feeds.get(key)
        if out is None:
            out = self._feeds.put(key, self._feed(stack, terminal))
        return out

    def _actions(self, state: int, terminal: str) -> tuple[Action, ...]:
        both = self.spec.conflicts.get((state, terminal))
        if both is not None:
            return both
        act = self.spec.actions[state].get(terminal)
        return () if act is None else (act,)

    def _feed(self, stack: Stack, terminal: str) -> tuple[Stack, ...]:
        actions, out, todo, seen = self.spec.actions, {}, [stack], {stack}
        for _ in range(MAX_REDUCTIONS):
            if not todo:
                break
            stack = todo.pop()
            for shift, arg in self._actions(stack[-1], terminal):
                if shift:
                    out[stack + (arg,)] = None
                    continue
                origin, size = arg
                base = stack[:-size] if size else stack
                nxt = base + (actions[base[-1]][origin][1],)
                if terminal == END and nxt[-1] == self.spec.end_state:
                    out[nxt] = None
                elif nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return tuple(out)

    def accepts_end(self, stack: Stack) -> bool:
        return bool(self.feed(stack, END))

    def acceptable(self, stack: Stack) -> frozenset[int]:
        """Terminal ids the parser can take next: those in the top state's row that shift after
        their reductions (the terminals that reduce by one rule share its walk). Cached by the
        top of the stack those reductions read: stacks that differ only below it take the same."""
        for depth in self._read_depths.get(stack[-1], ()):
            out = self._acceptable.get(stack[-depth:])
            if out is not None:
                return out
        ids = self.spec.terminal_ids
        names, depth = self._shiftable(stack, [name for name in self.spec.actions[stack[-1]] if name in ids])
        out = self._acceptable.put(stack[-depth:], frozenset(ids[name] for name in names))
        self._read_depths.setdefault(stack[-1], set()).add(depth)
        return out

    def _shiftable(self, stack: Stack, names: list[str]) -> tuple[set[str], int]:
        """(the names that shift after their reductions, how many states of the stack's top
        that read)."""
        actions, out, todo, seen, height = self.spec.actions, set(), [(stack, names)], set(), len(stack)
        low = height - 1  # the lowest stack position read
        for _ in range(MAX_REDUCTIONS):
            if not todo:
                break
            stack, names = todo.pop()
            reductions: dict[tuple[str, int], list[str]] = {}
            for name in names:
                for shift, arg in self._actions(stack[-1], name):
                    if shift:
                        out.add(name)
                    else:
                        reductions.setdefault(arg, []).append(name)
            for (origin, size), group in reductions.items():
                base = stack[:-size] if size else stack
                low = min(low, len(base) - 1)
                nxt = base + (actions[base[-1]][origin][1],)
                group = [name for name in group if name not in out and (nxt, name) not in seen]
                seen.update((nxt, name) for name in group)
                if group:
                    todo.append((nxt, group))
        return out, height - low
