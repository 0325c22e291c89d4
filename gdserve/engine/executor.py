"""Rank 0's side of tensor parallelism: it starts ranks 1..N-1 as worker processes, joins their
process group, runs every ModelRunner call on every rank, and supervises them.

A rank that dies (or raises, which ends it) fails the engine: a supervisor thread notices its
closed connection at once, aborts the process group so that rank 0's pending collective raises
instead of waiting on it, and every call from then on raises EngineDeadError naming the rank, its
exit status and its traceback."""
import inspect
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

import torch

from gdserve.config import EngineConfig
from gdserve.distributed.parallel_state import (abort_tensor_parallel, destroy_tensor_parallel,
                                                get_tensor_model_parallel_world_size, init_tensor_parallel)
from gdserve.engine.errors import EngineDeadError
from gdserve.engine.model_runner import ModelRunner, StepInput
from gdserve.engine.request import Sequence
from gdserve.engine.worker import COLLECTIVE_TIMEOUT, WorkerStart, rank_device
from gdserve.models.config import ModelConfig

logger = logging.getLogger(__name__)

FAILURE_GRACE_S = 5.0   # how long a failed collective waits for the supervisor to name the rank that died
STOP_TIMEOUT_S = 10.0   # how long a stopping worker gets before it is killed


@dataclass
class WorkerProcess:
    rank: int
    process: subprocess.Popen
    conn: Connection
    error: str | None = None   # the traceback it sent before exiting, if any


@dataclass
class GroupState:
    """What the supervisor thread shares with the caller's thread."""
    messages: queue.Queue = field(default_factory=queue.Queue)  # (rank, message) of started / ready
    failure: str | None = None
    failed: threading.Event = field(default_factory=threading.Event)
    stopping: bool = False


class MultiprocExecutor:
    def __init__(self, config: EngineConfig):
        size = config.tensor_parallel_size
        if get_tensor_model_parallel_world_size() > 1:
            raise RuntimeError("one tensor-parallel engine per process: close the other one first")
        self.device = rank_device(config, 0)
        if self.device.type == "cuda" and torch.cuda.device_count() < size:
            raise ValueError(f"tensor_parallel_size {size} needs {size} GPUs; {torch.cuda.device_count()} are visible")
        self.state = GroupState()
        self.num_threads = torch.get_num_threads()
        threads = max(1, _usable_cores() // size) if self.device.type == "cpu" else self.num_threads
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self.workers = [_spawn(WorkerStart(config, rank, init_method, threads)) for rank in range(1, size)]
        self._finalizer = weakref.finalize(self, _shutdown, self.workers, self.state, self.num_threads)
        threading.Thread(target=_supervise, args=(self.workers, self.state), daemon=True,
                         name="gdserve-tp-supervisor").start()
        try:
            self._wait_for_all("started")
            torch.set_num_threads(threads)
            init_tensor_parallel(0, size, init_method, self.device, COLLECTIVE_TIMEOUT)
        except BaseException:
            self.shutdown()
            raise

    def init_runner(self, model: torch.nn.Module, model_config: ModelConfig, num_blocks: int, block_size: int,
                    kv_cache_dtype: torch.dtype) -> "ParallelModelRunner":
        """A ModelRunner on every rank over its shard (rank 0's over `model`), each with a cache
        of num_blocks blocks of its KV heads; a previous one is dropped first."""
        self._wait_for_all("ready")
        self.send("init_runner", (num_blocks, block_size, kv_cache_dtype), {})
        local = ModelRunner(model, model_config, num_blocks, block_size, self.device, kv_cache_dtype)
        return ParallelModelRunner(local, self)

    def send(self, method: str, args: tuple, kwargs: dict) -> None:
        """Queue a call on every worker (they run them in order; none answers)."""
        self.check_alive()
        try:
            for worker in self.workers:
                worker.conn.send((method, args, kwargs))
        except OSError as e:
            raise self.failed(e) from e

    def check_alive(self) -> None:
        if self.state.failure is not None:
            raise EngineDeadError(self.state.failure)

    def failed(self, error: BaseException) -> EngineDeadError:
        """A call failed midway, which leaves the ranks out of step: the group is shut down. The
        error names the rank that died where one did (the likely cause)."""
        self.state.failed.wait(FAILURE_GRACE_S)
        message = self.state.failure or (f"tensor-parallel rank 0 failed ({type(error).__name__}: {error}); "
                                         "the ranks are out of step")
        self.shutdown()
        return EngineDeadError(message)

    def _wait_for_all(self, message: str) -> None:
        pending = {w.rank for w in self.workers}
        while pending:
            self.check_alive()
            try:
                rank, got = self.state.messages.get(timeout=0.1)
            except queue.Empty:
                continue
            if got == message:
                pending.discard(rank)

    def shutdown(self) -> None:
        """Stop the workers (killed if they do not stop in time) and leave the process group.
        Idempotent."""
        self._finalizer()


class ParallelModelRunner:
    """Rank 0's ModelRunner, whose method calls run on every rank: the call goes to the workers
    (method name and arguments), then runs here; only rank 0's result is returned. Attributes are
    rank 0's. A call that fails on any rank fails the engine (EngineDeadError)."""

    def __init__(self, local: ModelRunner, executor: MultiprocExecutor):
        self.local, self.executor = local, executor

    def __getattr__(self, name: str):
        attr = getattr(self.local, name)
        if not inspect.ismethod(attr) or name.startswith("_"):
            return attr
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    def _call(self, method: str, args: tuple, kwargs: dict):
        self.executor.send(method, args, kwargs)
        try:
            return getattr(self.local, method)(*args, **kwargs)
        except Exception as e:
            raise self.executor.failed(e) from e

    def execute(self, seqs: list[Sequence], num_new_tokens: list[int], sample_rows: list[int],
                pending_token_ids: torch.Tensor | None = None, lora_slots: list[int] | None = None) -> torch.Tensor:
        """ModelRunner.execute: rank 0 prepares the step; every rank runs its forward."""
        step: StepInput
        step, input_ids = self.local.prepare_step(seqs, num_new_tokens, sample_rows, pending_token_ids, lora_slots)
        self.executor.send("execute_step", (step,), {})
        try:
            return self.local.execute_step(step, input_ids)
        except Exception as e:
            raise self.executor.failed(e) from e


def _spawn(start: WorkerStart) -> WorkerProcess:
    ours, theirs = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-m", "gdserve.engine.worker", str(theirs.fileno())],
                               pass_fds=(theirs.fileno(),))
    theirs.close()
    conn = Connection(ours.detach())
    conn.send(start)
    return WorkerProcess(start.rank, process, conn)


def _supervise(workers: list[WorkerProcess], state: GroupState) -> None:
    """Read the workers' messages until each has exited; the first that exits while the group
    is not stopping fails it."""
    by_conn = {w.conn: w for w in workers}
    while by_conn:
        try:
            ready = wait(list(by_conn))
        except (OSError, ValueError):  # the connections were closed: the group has stopped
            return
        for conn in ready:
            worker = by_conn[conn]
            try:
                kind, *rest = conn.recv()
            except (EOFError, OSError):
                del by_conn[conn]
                if not state.stopping and state.failure is None:
                    _fail(state, worker)
                continue
            if kind == "error":
                worker.error = rest[0]
            else:
                state.messages.put((worker.rank, kind))


def _fail(state: GroupState, worker: WorkerProcess) -> None:
    try:
        code = worker.process.wait(timeout=FAILURE_GRACE_S)
    except subprocess.TimeoutExpired:
        code = None
    status = "closed its connection" if code is None else f"exited with {_describe_exit(code)}"
    message = f"tensor-parallel rank {worker.rank} (pid {worker.process.pid}) {status}"
    if worker.error:
        message += f"; its error:\n{worker.error}"
    logger.error("%s: the engine stops", message)
    state.failure = message
    state.failed.set()
    abort_tensor_parallel()  # rank 0's pending collective raises instead of waiting for the dead rank


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def _shutdown(workers: list[WorkerProcess], state: GroupState, num_threads: int) -> None:
    """Stop the workers, leave the process group, give rank 0 its threads back."""
    state.stopping = True
    for worker in workers:
        try:
            worker.conn.send(None)
        except OSError:
            pass
    for worker in workers:
        try:
            worker.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
        worker.conn.close()
    destroy_tensor_parallel()
    torch.set_num_threads(num_threads)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
