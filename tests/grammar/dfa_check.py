"""Byte DFAs compared by language: the DFA outlines-core builds for a regex, and an exact check."""
from gdserve.grammar.token_index import ByteDFA, build_byte_dfa, indexed_pattern, start_state


def equivalent(a, b) -> bool:
    """Same language from their starts: no reachable pair of states disagrees on accepting."""
    joint = sorted(set(zip(a.classes.tolist(), b.classes.tolist())))
    ta, tb = a.trans.tolist(), b.trans.tolist()
    seen, todo = {(a.start, b.start)}, [(a.start, b.start)]
    while todo:
        x, y = todo.pop()
        if a.final[x] != b.final[y]:
            return False
        for ca, cb in joint:
            pair = (ta[x][ca], tb[y][cb])
            if pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return True


def direct(regex: str) -> ByteDFA:
    dfa = build_byte_dfa(indexed_pattern(regex))
    return dfa.__class__(dfa.classes, dfa.trans, dfa.final, start_state(dfa))
