"""Run a test function in two gloo processes on the CPU: the distributed tests' one launcher."""

from __future__ import annotations

import os
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, *args) -> None:
    """fn(rank, *args) on every rank of a gloo group of WORLD processes; raises if any rank fails."""
    port = _free_port()
    mp.spawn(_rank_main, args=(port, fn, args), nprocs=WORLD, join=True)


def _rank_main(rank: int, port: int, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        fn(rank, *args)
        dist.barrier()  # no rank tears gloo down while another still has a collective in flight
    finally:
        dist.destroy_process_group()
    # A rank that finished its work leaves without the interpreter's finalization, where a gloo thread once
    # aborted a rank under heavy CPU load ("terminate called without an active exception") after its test passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
