"""LALR(1) parse tables from BNF rules (DeRemer and Pennello's lookahead sets), on integers.

lark's analyzer does the same on Python objects whose equality and hashing dominate its run time
(about half of a schema grammar's compile); here items are ints (an index into the rules'
concatenated expansions), a state's kernel a sorted tuple of them, and terminal sets are int
bitsets. Conflicts are resolved as lark resolves them: shift over reduce, then the higher rule
priority; two reductions of equal priority on one terminal are an error. Or, for a grammar whose
language must be exact (JSON Schema grammars), every action of a conflict is kept (`conflicts`)
and the parser follows each (cfg.parser).

The table's form is CfgSpec's: actions[state][symbol name] = (True, next state) for shifts and
gotos, (False, (rule origin, rule length)) for reductions; `$END` is shifted into the end state.
"""
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from gdserve.grammar.errors import GrammarError

END = "$END"
ROOT = "$root"

Action = tuple[bool, int | tuple[str, int]]


@dataclass(frozen=True)
class Rule:
    origin: str
    expansion: tuple[str, ...]
    priority: int = 0


@dataclass(frozen=True)
class LalrTable:
    actions: tuple[dict[str, Action], ...]
    start_state: int
    end_state: int
    # (state, terminal) -> every action there, where there is more than one (keep_conflicts)
    conflicts: dict[tuple[int, str], tuple[Action, ...]] = field(default_factory=dict)


def lalr_table(rules: Sequence[Rule], terminals: Collection[str], start: str = "start",
               keep_conflicts: bool = False) -> LalrTable:
    """The LALR(1) table of `rules` (symbols not in `terminals` must be some rule's origin).
    Raises GrammarError for an undefined symbol, a missing start rule or (unless keep_conflicts)
    a reduce/reduce conflict."""
    return _Builder(rules, terminals, start).table(keep_conflicts)


class _Builder:
    def __init__(self, rules: Sequence[Rule], terminals: Collection[str], start: str):
        rules = [Rule(ROOT, (start, END))] + list(dict.fromkeys(rules))
        origins = list(dict.fromkeys(r.origin for r in rules))
        if start not in origins:
            raise GrammarError(f"the grammar has no rule '{start}'")
        self.names = origins + sorted({s for r in rules for s in r.expansion} - set(origins))
        self.num_nt = len(origins)
        for name in self.names[self.num_nt:]:
            if name != END and name not in terminals:
                raise GrammarError(f"rule or terminal '{name}' is used but not defined")
        ids = {n: i for i, n in enumerate(self.names)}
        self.rules = rules
        self.rule_origin = [ids[r.origin] for r in rules]
        self.rule_len = [len(r.expansion) for r in rules]
        # item = rule's base + dot; item_sym[item] = the symbol after the dot, -1 at the end
        self.base, self.item_sym, self.item_rule = [], [], []
        for i, r in enumerate(rules):
            self.base.append(len(self.item_sym))
            self.item_sym += [ids[s] for s in r.expansion] + [-1]
            self.item_rule += [i] * (len(r.expansion) + 1)
        self.by_origin: list[list[int]] = [[] for _ in range(self.num_nt)]
        for i, o in enumerate(self.rule_origin):
            self.by_origin[o].append(i)
        self.nullable = self._nullable()
        self.closure_items = self._closure_items()

    def _is_nt(self, sym: int) -> bool:
        return 0 <= sym < self.num_nt

    def _nullable(self) -> list[bool]:
        nullable = [False] * self.num_nt
        changed = True
        while changed:
            changed = False
            for r, o in enumerate(self.rule_origin):
                if not nullable[o] and all(self._is_nt(s) and nullable[s]
                                           for s in self.item_sym[self.base[r]:self.base[r] + self.rule_len[r]]):
                    nullable[o] = changed = True
        return nullable

    def _closure_items(self) -> list[tuple[int, ...]]:
        """Per nonterminal: the dot-0 items of every nonterminal it starts with, itself included."""
        first_nt = [{self.item_sym[self.base[r]] for r in rs if self._is_nt(self.item_sym[self.base[r]])}
                    for rs in self.by_origin]
        out = []
        for a in range(self.num_nt):
            seen, todo = {a}, [a]
            while todo:
                for b in first_nt[todo.pop()]:
                    if b not in seen:
                        seen.add(b)
                        todo.append(b)
            out.append(tuple(self.base[r] for b in sorted(seen) for r in self.by_origin[b]))
        return out

    # ---- LR(0) automaton ----------------------------------------------------------------------
    def _lr0(self) -> None:
        self.kernels: list[tuple[int, ...]] = [(self.base[0],)]
        self.closures: list[tuple[int, ...]] = []
        self.trans: list[dict[int, int]] = []
        index = {self.kernels[0]: 0}
        item_sym = self.item_sym
        for kernel in self.kernels:  # grows while read: breadth-first
            closure = set(kernel)
            for item in kernel:
                if self._is_nt(item_sym[item]):
                    closure.update(self.closure_items[item_sym[item]])
            closure = tuple(sorted(closure))
            self.closures.append(closure)
            moves: dict[int, list[int]] = {}
            for item in closure:
                sym = item_sym[item]
                if sym >= 0:
                    moves.setdefault(sym, []).append(item + 1)
            trans = {}
            for sym, items in moves.items():
                k = tuple(items)  # sorted: the closure was
                target = index.get(k)
                if target is None:
                    target = index[k] = len(self.kernels)
                    self.kernels.append(k)
                trans[sym] = target
            self.trans.append(trans)

    # ---- lookaheads ---------------------------------------------------------------------------
    def _lookaheads(self) -> dict[tuple[int, int], int]:
        """(state, rule) -> bitset of terminal ids (bit = symbol id) on which it reduces."""
        nt_trans = [(p, a) for p, trans in enumerate(self.trans) for a in trans if self._is_nt(a)]
        nt_index = {t: k for k, t in enumerate(nt_trans)}
        direct, reads = [], []
        for p, a in nt_trans:
            r = self.trans[p][a]
            direct.append(sum(1 << s for s in self.trans[r] if not self._is_nt(s)))
            reads.append([nt_index[(r, c)] for c in self.trans[r] if self._is_nt(c) and self.nullable[c]])
        read = _digraph(reads, direct)
        includes: list[list[int]] = [[] for _ in nt_trans]
        lookback: dict[tuple[int, int], list[int]] = {}
        item_sym, trans, num_nt = self.item_sym, self.trans, self.num_nt
        tails = self._nullable_tails()
        for k, (p, b) in enumerate(nt_trans):
            for r in self.by_origin[b]:
                state, start, tail = p, self.base[r], tails[r]
                for i in range(start, start + self.rule_len[r]):
                    s = item_sym[i]
                    if s < num_nt and i + 1 >= tail:
                        includes[nt_index[(state, s)]].append(k)
                    state = trans[state][s]
                lookback.setdefault((state, r), []).append(k)
        follow = _digraph(includes, read)
        la = {}
        for key, ks in lookback.items():
            bits = 0
            for k in ks:
                bits |= follow[k]
            la[key] = bits
        return la

    def _nullable_tails(self) -> list[int]:
        """Per rule, the first item from which every symbol to the rule's end is a nullable
        nonterminal (its end where the last symbol is not)."""
        out = []
        for r, start in enumerate(self.base):
            i = start + self.rule_len[r]
            while i > start and self._is_nt(self.item_sym[i - 1]) and self.nullable[self.item_sym[i - 1]]:
                i -= 1
            out.append(i)
        return out

    # ---- the table ----------------------------------------------------------------------------
    def table(self, keep_conflicts: bool = False) -> LalrTable:
        self._lr0()
        la = self._lookaheads()
        names, conflicts = self.names, []
        actions, kept = [], {}
        for q, trans in enumerate(self.trans):
            row: dict[str, Action] = {names[s]: (True, t) for s, t in trans.items()}
            reducing: dict[int, int] = {}
            for item in self.closures[q]:
                if self.item_sym[item] >= 0:
                    continue
                r = self.item_rule[item]
                for t in _bits(la.get((q, r), 0)):
                    if keep_conflicts and (t in trans or t in reducing):
                        both = kept.setdefault((q, names[t]), [(True, trans[t])] if t in trans else [
                            (False, (self.rules[reducing[t]].origin, self.rule_len[reducing[t]]))])
                        both.append((False, (self.rules[r].origin, self.rule_len[r])))
                    if t in trans:
                        continue  # shift/reduce: shift
                    other = reducing.get(t)
                    if other is None or self.rules[r].priority > self.rules[other].priority:
                        reducing[t] = r
                    elif self.rules[r].priority == self.rules[other].priority:
                        conflicts.append((names[t], other, r))
            for t, r in reducing.items():
                row[names[t]] = (False, (self.rules[r].origin, self.rule_len[r]))
            actions.append(row)
        if conflicts and not keep_conflicts:
            raise GrammarError("\n\n".join(f"Reduce/Reduce collision in {t} between the following rules: "
                                           f"{self._show(a)} and {self._show(b)}" for t, a, b in conflicts[:5]))
        after_start = self.trans[0][self.names.index(self.rules[0].expansion[0])]
        return LalrTable(tuple(actions), 0, self.trans[after_start][self.names.index(END)],
                         {k: tuple(dict.fromkeys(v)) for k, v in kept.items()})

    def _show(self, r: int) -> str:
        rule = self.rules[r]
        return f"<{rule.origin} : {' '.join(rule.expansion)}>"


def _bits(x: int):
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


def _digraph(edges: list[list[int]], base: list[int]) -> list[int]:
    """F(x) = base(x) | F(y) for every edge x -> y, to the fixpoint: Tarjan's strongly connected
    components (iterative), each component's members share one set."""
    n = len(edges)
    index, low, out = [-1] * n, [0] * n, list(base)
    stack, on_stack, counter = [], [False] * n, 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            x, i = work[-1]
            if i == 0:
                index[x] = low[x] = counter
                counter += 1
                stack.append(x)
                on_stack[x] = True
            if i < len(edges[x]):
                work[-1] = (x, i + 1)
                y = edges[x][i]
                if index[y] < 0:
                    work.append((y, 0))
                elif on_stack[y]:
                    low[x] = min(low[x], index[y])
                    out[x] |= out[y]
                else:
                    out[x] |= out[y]
                continue
            work.pop()
            if low[x] == index[x]:
                members = []
                while True:
                    y = stack.pop()
                    on_stack[y] = False
                    members.append(y)
                    if y == x:
                        break
                bits = 0
                for y in members:
                    bits |= out[y]
                for y in members:
                    out[y] = bits
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[x])
                out[parent] |= out[x]
    return out
