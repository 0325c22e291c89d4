"""Matchers in worker processes: a step's guided rows computed on several cores at once.

A matcher's new work (a state's first row, a closing check near max_tokens) is mostly Python, so
threads would serialize on the GIL; a pool of plain subprocesses (started as compile workers are:
grammar/compile_worker.py) each holds the grammars placed on it and the matchers of their
sequences. A grammar stays on one worker while it lives (its caches are that worker's, and every
sequence of it gains from them), placed on the worker with the fewest live matchers.

The engine talks to all of them once per phase of a step: `advance` (each sequence's sampled
token: accepted?, terminated?, and the forced tokens that follow it: grammar/forced.py) and
`fill_rows` (each sequence's next row, packed, sent back as one blob per worker). Each message
carries the operations queued for that worker since its last one (load or drop a grammar, open
or close a matcher), so that placing a sequence costs no round trip. The workers run their parts
at once; the engine waits for the slowest.

Each worker bounds its step's new work by the engine's deadline (time.perf_counter is the
system's monotonic clock, the same in every process), as the engine's own thread does
(grammar/allowance.py), and goes on with the rows it answered PARKED until the engine's next
message comes (allowance.Interruptible), so that they are ready at a later ask. A worker that
dies fails the sequences placed on it (their states were there) and is started again for new
ones.
"""
import io
import itertools
import math
import os
import pickle
import signal
import threading
import time
import weakref
from collections import defaultdict, deque
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from gdserve.grammar.allowance import Allowance, Interruptible, MaskPending, allowing
from gdserve.grammar.compile_worker import (WorkerDied, WorkerProcess, TriePickler, TrieUnpickler, die_with_parent,
                                             load_vocabulary)
from gdserve.grammar.forced import take_forced_tokens
from gdserve.grammar.token_index import token_trie
from gdserve.grammar.vocabulary import TokenVocabulary

MODULE = "gdserve.grammar.matcher_pool"
ACCEPTED, REFUSED, TERMINATED = 0, 1, 2  # advance's answers (or an error's text)
READY, PARKED = 0, 1                     # fill_rows' answers (or an error's text)
BUSY_DECAY = 0.9  # a worker's moving average of its work per message: new grammars go where it is least


# ---- worker side -------------------------------------------------------------------------------
def main(fd: int, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        vocab, encode = conn.recv()
        load_vocabulary(vocab, None)  # nice 10, as the compile workers: neither starves the other
        worker = _Worker(token_trie(vocab.token_bytes, vocab.fingerprint), encode)
        conn.send(os.getpid())
        while True:
            if worker.parked and not conn.poll():
                worker.work_on_parked(conn.poll)  # until the engine's next message
            ops, kind, work, deadline = conn.recv()
            start = time.perf_counter()
            worker.apply(ops)
            conn.send((worker.run(kind, work, deadline), worker.busy_s + time.perf_counter() - start))
            start = time.perf_counter()
            worker.prefetch(deadline)  # while the engine reads the answers
            worker.busy_s = time.perf_counter() - start
    except (EOFError, OSError):  # the engine closed its end, or its process is gone
        pass


class _Worker:
    def __init__(self, trie, encode):
        self.trie = trie
        self.encode = encode  # the tokenizer's encoding (forced text's spelling), or None
        self.grammars: dict[int, object] = {}  # an Exception where the grammar could not be read
        self.matchers: dict[int, object] = {}
        self.to_prefetch: list[tuple[int, int]] = []  # (handle, budget) advanced, rows not asked yet
        self.parked: list[tuple[int, int]] = []  # (handle, budget) of the rows last answered PARKED
        self.prefetched: dict[int, tuple[int, np.ndarray]] = {}  # handle -> (budget, its row)
        self.busy_s = 0.0  # prefetching since the last answer

    def apply(self, ops: list[tuple]) -> None:
        for op, key, *rest in ops:
            if op == "load":
                try:
                    self.grammars[key] = TrieUnpickler(rest[0], self.trie).load()
                except Exception as e:  # noqa: BLE001 (its sequences fail with it)
                    self.grammars[key] = RuntimeError(f"the grammar could not be read: {type(e).__name__}: {e}")
            elif op == "drop":
                self.grammars.pop(key, None)
            elif op == "open":
                self.matchers[key] = _opened(self.grammars.get(rest[0], RuntimeError("the grammar was not loaded")),
                                             rest[1])
            elif op == "close":
                self.matchers.pop(key, None)
                self.prefetched.pop(key, None)

    def run(self, kind: str, work: list[tuple], deadline: float) -> object:
        if kind == "held":
            return len(self.grammars), len(self.matchers)
        allowance = Allowance(deadline)
        if kind == "advance":
            answers = []
            for h, t, _, limit in work:
                answer, forced = advance_matcher(self._matcher(h), t, allowance, limit, self.encode)
                answers.append((_text(answer), forced))
                self.prefetched.pop(h, None)  # a row is its state's: these moved on
            # a forced text's tokens count against the budget the row is asked for next
            self.to_prefetch = [(h, b - len(forced)) for (h, _, b, _), (a, forced) in zip(work, answers)
                                if a == ACCEPTED]
            return answers
        with allowing(allowance):
            return self._rows(work, allowance)

    def prefetch(self, deadline: float) -> None:
        """The rows the engine asks for next, computed while it reads the advance's answers
        (work left unfinished at the deadline stays cached for the ask)."""
        allowance = Allowance(deadline)
        with allowing(allowance):
            for handle, budget in self.to_prefetch:
                row = self._row(handle, budget, allowance)
                if not isinstance(row, int):  # PARKED: the ask goes on with the work done so far
                    self.prefetched[handle] = (budget, row)
        self.to_prefetch = []

    def work_on_parked(self, interrupted) -> None:
        """The rows last answered PARKED, computed while the engine runs its step, until
        `interrupted()` (a message waits): finished ones are kept for the next ask, and work cut
        short stays in the grammars' caches."""
        allowance = Interruptible(math.inf, interrupted=interrupted)
        with allowing(allowance):
            while self.parked:
                handle, budget = self.parked[0]
                row = self._row(handle, budget, allowance)
                if isinstance(row, int):  # PARKED: interrupted
                    return
                self.parked.pop(0)
                if isinstance(row, np.ndarray):  # an error is found again, and told, at the ask
                    self.prefetched[handle] = (budget, row)

    def _matcher(self, handle: int):
        matcher = self.matchers.get(handle, RuntimeError("the matcher was not opened"))
        return _Failed(matcher) if isinstance(matcher, Exception) else matcher

    def _row(self, handle: int, budget: int, allowance: Allowance) -> np.ndarray | int | Exception:
        """A matcher's packed row for `budget`, PARKED, or the exception it raised (inside
        `allowing(allowance)`)."""
        allowance.next_row()
        try:
            return self._matcher(handle).next_token_row(budget).numpy()
        except MaskPending:
            return PARKED
        except Exception as e:  # noqa: BLE001 (fails that sequence alone)
            return e

    def _rows(self, work: list[tuple[int, int]], allowance: Allowance) -> tuple[list[int | str], bytes]:
        out, rows = [], []
        self.parked = []
        for handle, budget in work:
            hit = self.prefetched.pop(handle, None)
            row = hit[1] if hit is not None and hit[0] == budget else self._row(handle, budget, allowance)
            if isinstance(row, np.ndarray):
                rows.append(row)
                out.append(READY)
            else:
                out.append(_text(row))  # PARKED, or the error's text
                if row == PARKED:
                    self.parked.append((handle, budget))
        return out, np.concatenate(rows).tobytes() if rows else b""


def advance_matcher(matcher, token_id: int, allowance: Allowance, force_limit: int = 0,
                    encode=None) -> tuple[int | Exception, list[int]]:
    """Advance a matcher by its sequence's sampled token and, where force_limit > 0, by the
    tokens of the forced text that follows it (at most force_limit: grammar/forced.py), spelled
    with `encode` (None: greedily). Returns (ACCEPTED, REFUSED (no change), TERMINATED (accepted,
    and only EOS can follow; not known within the allowance counts as not: the next row then
    holds only EOS), or the exception it raised; the forced tokens accepted). The accepts run
    whole (outside the allowance: a matcher's state never stops halfway)."""
    try:
        if not matcher.accept_token(token_id):
            return REFUSED, []
        forced = []
        if force_limit > 0:
            trie = matcher.grammar.trie
            context = trie.token_bytes(token_id) if token_id < trie.size else b""
            forced = take_forced_tokens(matcher, encode, context, force_limit)
        allowance.next_row()
        with allowing(allowance):
            try:
                return TERMINATED if matcher.is_terminated() else ACCEPTED, forced
            except MaskPending:
                return ACCEPTED, forced
    except Exception as e:  # noqa: BLE001 (fails that sequence alone)
        return e, []


def _opened(grammar, tokens: list[int]):
    """A new matcher of grammar past `tokens` (the forced text at its start), or the error."""
    if isinstance(grammar, Exception):
        return grammar
    matcher = grammar.matcher()
    if not all(matcher.accept_token(t) for t in tokens):
        return RuntimeError(f"the grammar refused the forced tokens {tokens} at its start")
    return matcher


@dataclass
class _Failed:
    """A matcher that could not be opened: every call raises why."""
    error: Exception

    def __getattr__(self, name: str):
        raise self.error


def _text(answer: int | Exception) -> int | str:
    return answer if isinstance(answer, int) else f"{type(answer).__name__}: {answer}"


# ---- engine side -------------------------------------------------------------------------------
class Unplaceable(Exception):
    """The grammar cannot travel to a worker (it does not pickle), or no worker runs."""


@dataclass(eq=False)
class RemoteMatcher:
    """The engine's handle on a matcher that lives in a pool worker."""
    pool: "MatcherPool"
    worker: int
    generation: int  # the worker's start count when placed: a restarted worker no longer holds it
    handle: int

    def __del__(self):
        self.pool.release(self)


class MatcherPool:
    def __init__(self, vocab: TokenVocabulary, num_workers: int, width: int, encode=None):
        """width: int32 words per packed row (the bitmask's). encode: the tokenizer's encoding
        (picklable: grammar/forced.py's TextEncoder), which spells forced text in the workers."""
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.width = width
        self._vocab_message = pickle.dumps((vocab, encode), protocol=pickle.HIGHEST_PROTOCOL)
        self._workers: list[WorkerProcess | None] = [None] * num_workers
        self._starting: list[threading.Thread | None] = [None] * num_workers
        self._generation = [0] * num_workers
        self._ops: list[list[tuple]] = [[] for _ in range(num_workers)]
        self._load = [0] * num_workers  # live matchers per worker
        self._busy = [0.0] * num_workers  # seconds of work per message, a moving average
        self._placed: dict[int, tuple[int, int, int]] = {}  # id(grammar) -> (worker, generation, key)
        # (worker, generation, handle) of released matchers and (id, placement) of collected
        # grammars, appended from any thread (a collection runs where the last reference goes),
        # taken in by the engine's thread before its next message
        self._released: deque[tuple[int, int, int]] = deque()
        self._forgotten: deque[tuple[int, tuple[int, int, int]]] = deque()
        self._ids = itertools.count()
        self._closed = False

    def start(self) -> None:
        """Start every worker in the background (this returns at once)."""
        for w in range(self.num_workers):
            if self._workers[w] is None and self._starting[w] is None:
                self._spawn(w)

    def matcher(self, grammar, payload: bytes | None = None, tokens: list[int] = ()) -> RemoteMatcher:
        """A new matcher of `grammar` on the worker that holds it (placed there now if none, from
        `payload` where given: the grammar pickled as the compile workers send it), past `tokens`."""
        self._take_released()
        placed = self._placed.get(id(grammar))
        if placed is None or placed[1] != self._generation[placed[0]]:
            running = [w for w in range(self.num_workers) if self._workers[w] or self._starting[w]]
            if not running:
                raise Unplaceable("no mask worker runs")
            try:
                weakref.ref(grammar)  # its workers' copy goes when it is collected
                payload = payload or _pickled(grammar)
            except Exception as e:  # noqa: BLE001 (a custom grammar that cannot travel)
                raise Unplaceable(f"{type(e).__name__}: {e}") from e
            w = min(running, key=lambda w: (self._busy[w], self._load[w]))
            placed = self._placed[id(grammar)] = (w, self._generation[w], next(self._ids))
            self._ops[w].append(("load", placed[2], payload))
            weakref.finalize(grammar, self._forget, id(grammar), placed)
        w, generation, key = placed
        handle = next(self._ids)
        self._ops[w].append(("open", handle, key, list(tokens)))
        self._load[w] += 1
        return RemoteMatcher(self, w, generation, handle)

    def advance(self, items: list[tuple[RemoteMatcher, int, int, int]], deadline: float
                ) -> list[tuple[int | str, list[int]]]:
        """Per (matcher, sampled token, budget, force limit): (ACCEPTED, REFUSED (the grammar
        refuses it: no change), TERMINATED (accepted, and only EOS can follow), or an error's
        text; the forced tokens accepted after it: advance_matcher). An ACCEPTED matcher's worker
        goes on to its row for that budget less its forced tokens (fill_rows' next ask)."""
        return [(answer, forced or []) for answer, forced in self._call("advance", items, deadline)]

    def fill_rows(self, items: list[tuple[RemoteMatcher, int]], deadline: float, out: np.ndarray) -> list[int | str]:
        """Per (matcher, budget): READY, PARKED (not ready within the deadline) or an error's
        text. The READY rows go to out (uint32 [>= len(items), width]) from its first row on, in
        the order of `items`."""
        answers = self._call("rows", items, deadline)
        n = 0
        for answer, row in answers:
            if answer == READY:
                out[n] = row
                n += 1
        return [answer for answer, _ in answers]

    def held(self) -> list[tuple[int, int] | None]:
        """Per worker: (grammars, matchers) it holds once its queued operations are done (None
        where it is not running)."""
        self._take_released()
        sent = [self._send(w, "held", [], 0.0) for w in range(self.num_workers)]
        return [self._receive(w) if ok else None for w, ok in enumerate(sent)]

    def worker_pids(self) -> list[int | None]:
        """Each worker's pid once started (None where it could not start)."""
        return [None if worker is None else worker.pid for worker in map(self._ready, range(self.num_workers))]

    def release(self, matcher: RemoteMatcher) -> None:
        """The matcher is no longer used (its worker drops it with its next message)."""
        self._released.append((matcher.worker, matcher.generation, matcher.handle))

    def close(self) -> None:
        self._closed = True
        for w in range(self.num_workers):
            worker = self._ready(w)
            if worker is not None:
                worker.close()
            self._workers[w] = None

    # ---- internals ----
    def _call(self, kind: str, items: list[tuple], deadline: float) -> list[tuple]:
        """One message to each worker that holds some of the items, then their answers: per item
        (answer, its row for READY rows)."""
        self._take_released()
        out: list[tuple] = [("its grammar worker exited", None)] * len(items)
        by_worker: dict[int, list[int]] = defaultdict(list)
        for k, (matcher, *_) in enumerate(items):
            if matcher.generation == self._generation[matcher.worker]:
                by_worker[matcher.worker].append(k)
        sent = [(w, ks) for w, ks in by_worker.items()
                if self._send(w, kind, [(items[k][0].handle, *items[k][1:]) for k in ks], deadline)]
        for w, ks in sent:
            reply = self._receive(w)
            if reply is None:
                continue
            if kind == "advance":
                for k, answer in zip(ks, reply):
                    out[k] = answer
                continue
            answers, blob = reply
            rows = iter(np.frombuffer(blob, dtype=np.uint32).reshape(-1, self.width))
            for k, answer in zip(ks, answers):
                out[k] = (answer, next(rows) if answer == READY else None)
        return out

    def _send(self, w: int, kind: str, work: list[tuple], deadline: float) -> bool:
        """Worker w's queued operations and `work`; False where it is not running (or died)."""
        worker = self._ready(w)
        if worker is None:
            return False
        ops, self._ops[w] = self._ops[w], []
        try:
            worker.conn.send((ops, kind, work, deadline))
            return True
        except (EOFError, OSError):
            self._died(w)
            return False

    def _receive(self, w: int) -> object | None:
        """Worker w's answer to what was sent; None where it died meanwhile."""
        try:
            reply, busy_s = self._workers[w].conn.recv()
        except (EOFError, OSError):
            self._died(w)
            return None
        self._busy[w] = BUSY_DECAY * self._busy[w] + (1 - BUSY_DECAY) * busy_s
        return reply

    def _spawn(self, w: int) -> None:
        worker = WorkerProcess.start(MODULE)
        self._starting[w] = threading.Thread(target=self._handshake, args=(w, worker), daemon=True,
                                             name=f"gdserve-matcher-start-{w}")
        self._starting[w].start()

    def _handshake(self, w: int, worker: WorkerProcess) -> None:
        try:
            worker.handshake(self._vocab_message)
            self._workers[w] = worker
        except WorkerDied:
            worker.close()

    def _ready(self, w: int) -> WorkerProcess | None:
        """Worker w once started (waits for its start); None where it could not start."""
        thread = self._starting[w]
        if thread is not None:
            thread.join()
            self._starting[w] = None
        return self._workers[w]

    def _died(self, w: int) -> None:
        """Worker w is gone with its grammars and matchers: those placed there fail, new ones go
        to a new worker."""
        worker, self._workers[w] = self._workers[w], None
        if worker is not None:
            worker.close()
        self._generation[w] += 1
        self._ops[w], self._load[w] = [], 0
        if not self._closed:
            self._spawn(w)

    def _take_released(self) -> None:
        """Queue the closes of released matchers and the drops of collected grammars."""
        while self._released:
            w, generation, handle = self._released.popleft()
            if generation == self._generation[w]:
                self._ops[w].append(("close", handle))
                self._load[w] -= 1
        while self._forgotten:
            grammar_id, placed = self._forgotten.popleft()
            if self._placed.get(grammar_id) == placed:
                del self._placed[grammar_id]
            w, generation, key = placed
            if generation == self._generation[w]:
                self._ops[w].append(("drop", key))

    def _forget(self, grammar_id: int, placed: tuple[int, int, int]) -> None:
        """The grammar is gone (weakref.finalize, any thread): its worker drops its copy."""
        self._forgotten.append((grammar_id, placed))


def _pickled(grammar) -> bytes:
    """The grammar as the compile workers send it (its token trie by the vocabulary's fingerprint)."""
    buffer = io.BytesIO()
    TriePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(grammar)
    return buffer.getvalue()
