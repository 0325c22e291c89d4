"""A tensor-parallel rank other than 0: a plain subprocess of the engine's interpreter
(`python -m gdserve.engine.worker FD`, so scripts need no main guard), holding its shard of the
model and a ModelRunner over its shard of the KV cache. It runs the calls rank 0 sends, in order,
until told to stop; rank 0 alone schedules and samples.

The protocol, over a socket pair (multiprocessing Connection: pickled tuples):
  rank 0 -> worker: WorkerStart once, then (method, args, kwargs) per call, then None to stop;
  worker -> rank 0: ("started",) before joining the group, ("ready",) once its shard is loaded,
  ("error", traceback) before it exits on an exception.
"""
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection

import torch

from gdserve.config import EngineConfig
from gdserve.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from gdserve.engine.model_runner import ModelRunner
from gdserve.layers.attention import use_fp8_attention
from gdserve.models.config import ModelConfig
from gdserve.models.loader import load_model, resolve_model, source_gguf

# Longest a collective waits for a rank that is alive but stuck; a rank that dies is noticed by
# rank 0's supervisor within a second.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class WorkerStart:
    config: EngineConfig
    rank: int
    init_method: str       # tcp://host:port of the group's rendezvous, served by rank 0
    num_threads: int       # torch threads (CPU): the machine's cores shared among the ranks


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """cuda:rank on CUDA (one GPU per rank), else the CPU."""
    device = config.torch_device()
    return torch.device("cuda", rank) if device.type == "cuda" else device


def load_shard(config: EngineConfig, device: torch.device) -> tuple[torch.nn.Module, ModelConfig]:
    """This rank's shard of the model (the whole model without tensor parallelism)."""
    torch.manual_seed(config.seed)
    model, model_config = load_model(resolve_model(config.model), config.torch_dtype(), device,
                                     config.load_format, config.quantization, source_gguf(config.model))
    if config.fp8_attention:
        use_fp8_attention(model, config.torch_dtype())
    return model, model_config


class Worker:
    """One rank's model shard and, once rank 0 sizes the cache, its ModelRunner."""

    def __init__(self, start: WorkerStart):
        self.config = start.config
        self.device = rank_device(start.config, start.rank)
        self.model, self.model_config = load_shard(start.config, self.device)
        self.runner: ModelRunner | None = None

    def init_runner(self, num_blocks: int, block_size: int, kv_cache_dtype: torch.dtype) -> None:
        self.runner = None  # the previous cache (a profiling one) goes first
        self.runner = ModelRunner(self.model, self.model_config, num_blocks, block_size, self.device,
                                  kv_cache_dtype)

    def call(self, method: str, args: tuple, kwargs: dict) -> None:
        target = self if method == "init_runner" else self.runner
        getattr(target, method)(*args, **kwargs)


def _exit_with_parent() -> None:
    """Exit when rank 0's process is gone, even while blocked in a collective."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def serve(conn: Connection) -> None:
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    start: WorkerStart = conn.recv()
    torch.set_num_threads(start.num_threads)
    conn.send(("started",))
    init_tensor_parallel(start.rank, start.config.tensor_parallel_size, start.init_method,
                         rank_device(start.config, start.rank), COLLECTIVE_TIMEOUT)
    worker = Worker(start)
    conn.send(("ready",))
    while (message := conn.recv()) is not None:
        worker.call(*message)
    destroy_tensor_parallel()  # only on a clean stop: with a rank gone it could wait on it


def main() -> None:
    conn = Connection(int(sys.argv[1]))
    try:
        serve(conn)
    except EOFError:  # rank 0 closed the connection: nothing to report to
        sys.exit(1)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        sys.exit(1)


if __name__ == "__main__":
    main()
