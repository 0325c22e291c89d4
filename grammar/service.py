"""CompileService: grammar compiles in worker processes, bounded by a timeout, cached.

Each worker is a lane: its own single-process ProcessPoolExecutor (`spawn` context, so a main
script needs the `if __name__ == "__main__":` guard). A lane's first task hands the worker the
tokenizer's TokenVocabulary, once, and builds its token trie there. (Not through the
pool initializer: initargs are written to the new process while it imports, blocking the caller
for a second or more, and lanes restart from threads that must not stall.)

A job runs only on an idle, started lane, so its clock measures the compile alone, and a lane
that times out or dies takes exactly its one job down: on expiry the worker is killed (SIGKILL)
and the lane restarted; a worker that dies on its own fails its job and restarts too. Grammars
come back pickled (the byte DFA's arrays; the token trie is interned per tokenizer on arrival).

submit() never waits for a compile: it returns a Future, already completed on a cache hit.
Compiled grammars, compile errors and timeouts are cached (two bounded LRUs); crashes are not.
A job that fails through no fault of its constraint (its worker died or could not start, or the
service closed) fails with CompilerUnavailableError, so a caller can tell "retry" from "fix it".
With cache_dir, compiled grammars also persist on disk and are found there after a restart.
"""
import json
import multiprocessing
import os
import resource
import signal
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gdserve.grammar.compiler import compile_with_vocabulary
from gdserve.grammar.disk_cache import DiskCache
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.matcher import Grammar
from gdserve.grammar.token_index import token_trie
from gdserve.grammar.vocabulary import TokenVocabulary, token_vocabulary
from gdserve.utils import settle_gc

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OPTIONS = ("whitespace_pattern", "lenient", "open_objects")
ERROR_CACHE_SIZE = 64


class CompilerUnavailableError(GrammarError):
    """The compile failed through no fault of the constraint: the same spec may compile on retry."""

# ---- worker side -------------------------------------------------------------------------------
_worker_vocab: TokenVocabulary | None = None


def _load_vocabulary(vocab: TokenVocabulary, memory_limit_mb: int | None) -> int:
    """A lane's first task: keep the vocabulary for every later compile, yield the CPU to the
    engine (nice 10), and cap the worker's address space at its current size + memory_limit_mb
    (an index that explodes then aborts the worker instead of pushing the host into the OOM
    killer). Returns the worker pid."""
    global _worker_vocab
    _worker_vocab = vocab
    os.nice(10)
    token_trie(vocab.token_bytes, vocab.fingerprint)
    settle_gc()
    if memory_limit_mb is not None:
        mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = mapped + memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return os.getpid()


def _compile_in_worker(kind: str, spec: object, options: dict, vocab_size: int | None) -> Grammar:
    try:
        return compile_with_vocabulary(kind, spec, _worker_vocab, vocab_size=vocab_size, **options)
    except GrammarError:
        raise
    except BaseException as e:  # incl. Rust panics: report them as a failed compile
        raise GrammarError(f"{kind} compile failed: {type(e).__name__}: {e}") from None


# ---- service side ------------------------------------------------------------------------------
class LRU(OrderedDict):
    def __init__(self, max_size: int):
        super().__init__()
        self.max_size = max_size

    def get_fresh(self, key):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return None

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.max_size:
            self.popitem(last=False)


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
    """One worker process: its executor, its pid once started, and the job it runs."""
    executor: ProcessPoolExecutor | None = None
    pid: int | None = None
    job: _Job | None = None
    deadline: float = float("inf")

    @property
    def idle(self) -> bool:
        return self.pid is not None and self.job is None


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
                 memory_limit_mb: int | None = 4096, cache_dir: str | Path | None = None):
        """cache_dir: compiled grammars also persist there (grammar/disk_cache.py), across restarts."""
        self.vocab = token_vocabulary(tokenizer, eos_token_ids)
        self._disk = DiskCache(cache_dir) if cache_dir is not None else None
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.memory_limit_mb = memory_limit_mb
        self._grammars = LRU(cache_size)
        self._errors = LRU(min(cache_size, ERROR_CACHE_SIZE))
        self._pending: dict[tuple, _Job] = {}
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition(threading.RLock())
        self._closed = False
        self._mp_context = multiprocessing.get_context("spawn")
        self._lanes = [_Lane() for _ in range(max_workers)]
        with self._cond:
            for lane in self._lanes:
                self._start(lane)
        self._watchdog = threading.Thread(target=self._watch, name="grammar-compile-watchdog",
                                          daemon=True)
        self._watchdog.start()

    # ---- public API ----
    def submit(self, kind: str, spec: object, **options) -> "Future[Grammar]":
        """A Future of the compiled Grammar; fails with GrammarError (bad spec, timeout, crash)."""
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise TypeError(f"unknown compile options {sorted(unknown)}: expected {OPTIONS}")
        key = (kind, canonical_spec(spec), tuple(sorted(options.items())), self.vocab_size,
               self.vocab.fingerprint)
        with self._cond:
            if self._closed:
                raise RuntimeError("CompileService is closed")
            cached = self._grammars.get_fresh(key) or self._errors.get_fresh(key)
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

    def worker_pids(self) -> list[int]:
        """The pids of the started workers."""
        with self._cond:
            return [lane.pid for lane in self._lanes if lane.pid is not None]

    def close(self) -> None:
        """Fail the queued and running jobs, stop the workers."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            closed = CompilerUnavailableError("the grammar compile service was closed")
            for job in [*self._queue, *(lane.job for lane in self._lanes if lane.job)]:
                self._settle(job, error=closed, cache=False)
            self._queue.clear()
            for lane in self._lanes:
                self._stop(lane)
            self._cond.notify_all()
        self._watchdog.join()
        if self._disk is not None:
            self._disk.close()

    def __enter__(self) -> "CompileService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- lanes (all called with self._cond held) ----
    def _start(self, lane: _Lane) -> None:
        executor = ProcessPoolExecutor(1, mp_context=self._mp_context)
        lane.executor, lane.pid, lane.job, lane.deadline = executor, None, None, float("inf")
        executor.submit(_load_vocabulary, self.vocab, self.memory_limit_mb).add_done_callback(
            lambda f: self._on_started(lane, executor, f))

    def _stop(self, lane: _Lane) -> None:
        """Kill the worker (it may be stuck in a compile) and drop the executor."""
        if lane.pid is not None:
            try:
                os.kill(lane.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if lane.executor is not None:
            lane.executor.shutdown(wait=False, cancel_futures=True)
        lane.executor, lane.pid, lane.job, lane.deadline = None, None, None, float("inf")

    def _restart(self, lane: _Lane) -> None:
        self._stop(lane)
        self._start(lane)

    def _on_started(self, lane: _Lane, executor: ProcessPoolExecutor, started: Future) -> None:
        with self._cond:
            if lane.executor is not executor or self._closed:
                return
            try:
                lane.pid = started.result()
            except BaseException as e:  # the worker cannot start: fail what waits, retry on demand
                self._stop(lane)
                error = CompilerUnavailableError(f"grammar compile worker failed to start: {e!r}")
                while self._queue:
                    self._settle(self._queue.popleft(), error=error, cache=False)
                return
            self._dispatch()

    def _dispatch(self) -> None:
        for lane in self._lanes:
            if lane.executor is None and self._queue:
                self._start(lane)
            if lane.idle and self._queue:
                self._run(lane, self._queue.popleft())

    def _run(self, lane: _Lane, job: _Job) -> None:
        try:
            inner = lane.executor.submit(_compile_in_worker, job.kind, job.spec, job.options,
                                         self.vocab_size)
        except BrokenProcessPool:  # the worker died while idle: run the job on a fresh one
            self._queue.appendleft(job)
            lane.pid = None  # already reaped: its pid may belong to another process by now
            self._restart(lane)
            return
        lane.job, lane.deadline = job, time.monotonic() + self.timeout_s
        inner.add_done_callback(lambda f: self._on_done(lane, job, f))
        self._cond.notify_all()

    def _on_done(self, lane: _Lane, job: _Job, inner: Future) -> None:
        with self._cond:
            if lane.job is not job:  # timed out (already settled) or the service closed
                return
            lane.job, lane.deadline = None, float("inf")
            try:
                self._settle(job, grammar=inner.result())
            except GrammarError as e:
                self._settle(job, error=e)
            except BrokenProcessPool:
                self._settle(job, error=CompilerUnavailableError(
                    f"the grammar compile worker died while compiling this {job.kind} constraint "
                    "(killed, or out of memory)"), cache=False)
                lane.pid = None  # dead already
                self._restart(lane)
            except BaseException as e:
                self._settle(job, error=GrammarError(f"{job.kind} compile failed: {e!r}"),
                             cache=False)
            self._dispatch()

    def _watch(self) -> None:
        """Expire jobs past their deadline: fail them, kill and restart their worker."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for lane in self._lanes:
                    if lane.job is not None and lane.deadline <= now:
                        self._expire(lane)
                wake = min(lane.deadline for lane in self._lanes) - time.monotonic()
                self._cond.wait(None if wake == float("inf") else max(wake, 0.0))

    def _expire(self, lane: _Lane) -> None:
        job = lane.job
        self._settle(job, error=GrammarError(
            f"{job.kind} compile timed out after {self.timeout_s} s (the constraint is too large "
            "or too complex to index)"))
        self._restart(lane)
        self._dispatch()

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
