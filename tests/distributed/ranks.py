"""Run a function on every rank of a tensor-parallel group of processes on this machine (gloo on
the CPU, NCCL on cuda:0..N-1), as the engine's ranks run."""
import multiprocessing
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch

from gdserve.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(torch.cuda.device_count() < 2,
                                                                reason="needs 2 CUDA devices"))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn: Callable, rank: int, size: int, device_type: str, init_method: str, errors) -> None:
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    try:
        init_tensor_parallel(rank, size, init_method, device, timedelta(seconds=60))
        fn(rank, size, device)
        destroy_tensor_parallel()
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        raise


def run_ranks(fn: Callable[[int, int, torch.device], None], size: int, device_type: str = "cpu") -> None:
    """fn(rank, size, device) on `size` spawned ranks; fails with the first rank's traceback."""
    ctx = multiprocessing.get_context("spawn")
    errors = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(fn, rank, size, device_type, init_method, errors))
             for rank in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
    if not errors.empty():
        rank, tb = errors.get()
        pytest.fail(f"rank {rank} failed:\n{tb}")
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
