"""CompileService: grammar compiles in worker processes, bounded by a timeout, cached.

Each worker is a lane: a plain subprocess (grammar/compile_worker.py: it never imports the
caller's __main__, so scripts need no main guard) owned by one thread of the service, which
starts it, ships it the tokenizer's TokenVocabulary once (it builds its token trie there), then
hands it one job at a time. Lanes start on demand: none before the first compile, another while
jobs queue beyond the lanes starting, up to max_workers; so submit() never waits for a worker to
start, and an idle service holds only the workers its load has needed.

A job runs only on an idle, started lane, so its clock measures the compile alone, and a lane
that times out or dies takes exactly its one job down: on expiry the worker is killed (SIGKILL);
a worker that dies on its own fails its job. Either way the lane ends and another starts if jobs
wait. Grammars come back pickled (the byte DFA's arrays; the token trie, built here once, by
reference).

submit() never waits for a compile: it returns a Future, already completed on a cache hit.
Compiled grammars, compile errors and timeouts are cached (two bounded LRUs); crashes are not.
A job that fails through no fault of its constraint (its worker died or could not start, or the
service closed) fails with CompilerUnavailableError, so a caller can tell "retry" from "fix it".
With cache_dir, compiled grammars also persist on disk and are found there after a restart.
With keep_payloads, the bytes a grammar came back in are kept (the newest, up to
PAYLOAD_BUDGET_BYTES) until take_payload() takes them: a mask worker loads the grammar from them,
so the caller need not pickle it again.
"""
import json
import os
import pickle
import threading
import weakref
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gdserve.grammar.bounded_cache import BoundedCache
from gdserve.grammar.compile_worker import WorkerDied, WorkerProcess
from gdserve.grammar.disk_cache import DiskCache
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.matcher import Grammar
from gdserve.grammar.token_index import token_trie
from gdserve.grammar.vocabulary import token_vocabulary

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OPTIONS = ("whitespace_pattern", "lenient", "open_objects")
ERROR_CACHE_SIZE = 64
PAYLOAD_BUDGET_BYTES = 256 << 20  # compiled grammars' bytes kept for take_payload()


class CompilerUnavailableError(GrammarError):
    """The compile failed through no fault of the constraint: the same spec may compile on retry."""


# ---- service side ------------------------------------------------------------------------------
def _running_future() -> Future:
    """Shared by every caller of the same spec, so no caller may cancel it for the others."""
    future = Future()
    future.set_running_or_notify_cancel()
    return future


@dataclass
class _Job:
    key: tuple
    kind: str
    spec: object
    options: dict
    future: Future = field(default_factory=_running_future)


@dataclass
class _Lane:
    """One worker and the thread that owns it; the job _dispatch handed it, if any. The thread
    blocks on the worker's socket and on `wakeup` (a pipe _dispatch and close() write to)."""
    thread: threading.Thread | None = None
    worker: WorkerProcess | None = None
    ready: bool = False  # started and taking jobs
    job: _Job | None = None
    wakeup: tuple[int, int] = field(default_factory=os.pipe)

    @property
    def idle(self) -> bool:
        return self.ready and self.job is None

    def wake(self) -> None:
        os.write(self.wakeup[1], b"\0")


def canonical_spec(spec: object) -> object:
    """A hashable, order-independent form of a spec: the str itself, else sorted-keys JSON."""
    if isinstance(spec, str):
        return spec
    try:
        return json.dumps(spec, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(spec)


class CompileService:
    """Compiles grammars for one tokenizer off the caller's thread (see the module docstring)."""

    def __init__(self, tokenizer: "PreTrainedTokenizerBase", max_workers: int = 1,
                 timeout_s: float = 10.0, cache_size: int = 256,
                 eos_token_ids: set[int] | None = None, vocab_size: int | None = None,
                 memory_limit_mb: int | None = 4096, cache_dir: str | Path | None = None,
                 keep_payloads: bool = False):
        """cache_dir: compiled grammars also persist there (grammar/disk_cache.py), across restarts.
        keep_payloads: keep the bytes each grammar came back in, for take_payload()."""
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.vocab = token_vocabulary(tokenizer, eos_token_ids)
        self.trie = token_trie(self.vocab.token_bytes, self.vocab.fingerprint)  # what every grammar walks
        self._disk = DiskCache(cache_dir) if cache_dir is not None else None
        self.vocab_size = vocab_size
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self.memory_limit_mb = memory_limit_mb
        # Pickled here, once: in a lane's thread it would hold the GIL while submit() waits on it.
        self._vocab_message = pickle.dumps((self.vocab, memory_limit_mb), protocol=pickle.HIGHEST_PROTOCOL)
        self._grammars = BoundedCache(cache_size, policy="lru")
        self._errors = BoundedCache(min(cache_size, ERROR_CACHE_SIZE), policy="lru")
        self._pending: dict[tuple, _Job] = {}
        self._queue: deque[_Job] = deque()
        self._lock = threading.RLock()
        self._closed = False
        self._lanes: list[_Lane] = []
        self._payloads = _Payloads(PAYLOAD_BUDGET_BYTES) if keep_payloads else None

    # ---- public API ----
    @property
    def num_busy(self) -> int:
        """Workers compiling now (or about to: jobs queued beyond them wait)."""
        with self._lock:
            return min(len(self._pending), self.max_workers)

    def submit(self, kind: str, spec: object, **options) -> "Future[Grammar]":
        """A Future of the compiled Grammar; fails with GrammarError (bad spec, timeout, crash)."""
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise TypeError(f"unknown compile options {sorted(unknown)}: expected {OPTIONS}")
        key = (kind, canonical_spec(spec), tuple(sorted(options.items())), self.vocab_size,
               self.vocab.fingerprint)
        with self._lock:
            if self._closed:
                raise RuntimeError("CompileService is closed")
            cached = self._grammars.lookup(key) or self._errors.lookup(key)
            if cached is not None:
                return cached
            stored = self._disk.get(key) if self._disk is not None else None
            if stored is not None:
                future: Future[Grammar] = Future()
                future.set_result(stored)
                self._grammars.put(key, future)
                return future
            if key in self._pending:
                return self._pending[key].future
            job = self._pending[key] = _Job(key, kind, spec, options)
            self._queue.append(job)
            self._dispatch()
            return job.future

    def compile(self, kind: str, spec: object, **options) -> Grammar:
        """Blocking submit: the Grammar, or GrammarError."""
        return self.submit(kind, spec, **options).result()

    def take_payload(self, grammar: Grammar) -> bytes | None:
        """The bytes `grammar` came back from its compile worker in (pickled with its token trie
        by reference: compile_worker.TrieUnpickler reads them), once; None where they were not
        kept (keep_payloads off, a cache or disk hit, taken before, or dropped for newer ones)."""
        if self._payloads is None:
            return None
        with self._lock:
            return self._payloads.take(grammar)

    def start_workers(self) -> None:
        """Start every worker now, in the background (this returns at once), so that the first
        compiles need not wait for a worker to start (a new Python importing torch: seconds)."""
        with self._lock:
            while not self._closed and len(self._lanes) < self.max_workers:
                self._start_lane()

    def worker_pids(self) -> list[int]:
        """The pids of the started workers."""
        with self._lock:
            return [lane.worker.pid for lane in self._lanes if lane.ready]

    def close(self) -> None:
        """Fail the queued and running jobs, stop the workers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            closed = CompilerUnavailableError("the grammar compile service was closed")
            for job in [*self._queue, *(lane.job for lane in self._lanes if lane.job)]:
                self._settle(job, error=closed, cache=False)
            self._queue.clear()
            lanes = list(self._lanes)
            for lane in lanes:
                if lane.worker is not None:
                    lane.worker.kill()
                lane.wake()
        for lane in lanes:
            lane.thread.join()
        if self._disk is not None:
            self._disk.close()

    def __enter__(self) -> "CompileService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- dispatch (called with self._lock held) ----
    def _dispatch(self) -> None:
        """Hand queued jobs to idle lanes; start lanes for the jobs the starting ones won't take."""
        if self._closed:
            return
        for lane in self._lanes:
            if lane.idle and self._queue:
                lane.job = self._queue.popleft()
                lane.wake()
        starting = sum(not lane.ready for lane in self._lanes)
        while len(self._queue) > starting and len(self._lanes) < self.max_workers:
            self._start_lane()
            starting += 1

    def _start_lane(self) -> None:
        lane = _Lane()
        lane.thread = threading.Thread(target=self._serve, args=(lane,), daemon=True,
                                       name="grammar-compile-lane")
        self._lanes.append(lane)
        lane.thread.start()

    def _settle(self, job: _Job, grammar: Grammar | None = None,
                error: GrammarError | None = None, cache: bool = True) -> None:
        self._pending.pop(job.key, None)
        if job.future.done():
            return
        if grammar is not None:
            job.future.set_result(grammar)
            self._grammars.put(job.key, job.future)
            if self._disk is not None:
                self._disk.put(job.key, grammar)
        else:
            job.future.set_exception(error)
            if cache:
                self._errors.put(job.key, job.future)

    # ---- a lane's thread ----
    def _serve(self, lane: _Lane) -> None:
        """Start the lane's worker, then run the jobs _dispatch hands it until the worker times
        out or dies, or the service closes; then the lane ends."""
        try:
            worker = WorkerProcess.start()
        except OSError as e:
            self._end(lane, start_error=e)
            return
        with self._lock:
            lane.worker = worker
            if self._closed:
                worker.kill()
        try:
            worker.handshake(self._vocab_message)
        except WorkerDied as e:
            self._end(lane, start_error=e)
            return
        with self._lock:
            lane.ready = True
            self._dispatch()
        while not self._closed and worker.wait_idle(lane.wakeup[0]):
            os.read(lane.wakeup[0], 64)
            with self._lock:
                job = lane.job
            if job is not None and not self._run(lane, job):
                break
        self._end(lane)

    def _run(self, lane: _Lane, job: _Job) -> bool:
        """Run the job on the lane's worker and settle it; False when the worker is gone (killed
        on timeout, or dead)."""
        try:
            result = lane.worker.compile(job.kind, job.spec, job.options, self.vocab_size, self.timeout_s,
                                         self.trie)
        except WorkerDied:
            result = CompilerUnavailableError(
                f"the grammar compile worker died while compiling this {job.kind} constraint "
                "(killed, or out of memory)")
        with self._lock:
            lane.job = None
            if result is None:
                self._settle(job, error=GrammarError(
                    f"{job.kind} compile timed out after {self.timeout_s} s (the constraint is too "
                    "large or too complex to index)"))
            elif isinstance(result, CompilerUnavailableError):
                self._settle(job, error=result, cache=False)
            elif isinstance(result, GrammarError):
                self._settle(job, error=result)
            else:
                grammar, payload = result
                if self._payloads is not None:
                    self._payloads.put(grammar, payload)
                self._settle(job, grammar=grammar)
            lane.ready = result is not None and not isinstance(result, CompilerUnavailableError)
            if lane.ready:
                self._dispatch()
            return lane.ready

    def _end(self, lane: _Lane, start_error: BaseException | None = None) -> None:
        """The lane's worker is gone or going: reap it, drop the lane, and start another for the
        queued jobs; a worker that could not start fails the queued jobs (no lane may take them:
        a later submit tries again)."""
        if lane.worker is not None:
            lane.worker.close()
        with self._lock:
            self._lanes.remove(lane)
            if start_error is None:
                self._dispatch()
            elif not self._closed and not any(other.ready for other in self._lanes):
                error = CompilerUnavailableError(f"grammar compile worker failed to start: {start_error}")
                while self._queue:
                    self._settle(self._queue.popleft(), error=error, cache=False)
        for fd in lane.wakeup:
            os.close(fd)


class _Payloads:
    """Bytes by grammar, oldest dropped first past max_bytes. Keyed by id() with a weak reference
    beside (most grammars are unhashable dataclasses), so that a collected grammar's id reused by
    another object finds nothing."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict[int, tuple[weakref.ref, bytes]] = OrderedDict()
        self._bytes = 0

    def put(self, grammar: Grammar, payload: bytes) -> None:
        try:
            ref = weakref.ref(grammar)
        except TypeError:  # a grammar without weak references: nothing kept
            return
        self._pop(id(grammar))
        self._items[id(grammar)] = (ref, payload)
        self._bytes += len(payload)
        while self._bytes > self.max_bytes:
            self._pop(next(iter(self._items)))

    def take(self, grammar: Grammar) -> bytes | None:
        item = self._pop(id(grammar))
        return item[1] if item is not None and item[0]() is grammar else None

    def _pop(self, key: int) -> tuple[weakref.ref, bytes] | None:
        item = self._items.pop(key, None)
        if item is not None:
            self._bytes -= len(item[1])
        return item
