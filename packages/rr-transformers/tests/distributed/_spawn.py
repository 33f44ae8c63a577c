"""Run a function on N gloo ranks, each a spawned process, and return each rank's result.

The first rank that raises fails the call with its own traceback, a hard timeout ends hung
collectives, and no process outlives the call. The ranks meet through a file in a temporary
folder (no port to race for)."""

from __future__ import annotations

import multiprocessing as mp
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class RankFailedError(RuntimeError):
    """A rank raised or died; the message carries its rank and traceback."""


def _rank_main(
    rank: int,
    world_size: int,
    rendezvous: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size
        )
        try:
            value = fn(*args)
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        return
    results.put((rank, True, value))


def run_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0
) -> list[Any]:
    """``fn(*args)`` on ranks 0..world_size-1, results by rank. ``fn``, ``args`` and results
    must pickle; define ``fn`` at module level."""
    context = mp.get_context("spawn")
    results = context.Queue()
    values: dict[int, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        rendezvous = str(Path(folder) / "rendezvous")
        processes = [
            context.Process(
                target=_rank_main,
                args=(rank, world_size, rendezvous, fn, args, results),
                name=f"rank{rank}",
                daemon=True,
            )
            for rank in range(world_size)
        ]
        deadline = time.monotonic() + timeout_s
        try:
            for process in processes:
                process.start()
            while len(values) < world_size:
                try:
                    rank, ok, value = results.get(timeout=0.2)
                except queue.Empty:
                    _check_alive(processes, values, deadline, timeout_s)
                    continue
                if not ok:
                    raise RankFailedError(f"rank {rank} failed:\n{value}")
                values[rank] = value
        finally:
            _end(processes)
            results.close()
    return [values[rank] for rank in range(world_size)]


def _check_alive(
    processes: list[Any], values: dict[int, Any], deadline: float, timeout_s: float
) -> None:
    for rank, process in enumerate(processes):
        if rank not in values and process.exitcode not in (None, 0):
            raise RankFailedError(
                f"rank {rank} exited with code {process.exitcode} and no traceback"
            )
    if time.monotonic() > deadline:
        pending = [rank for rank in range(len(processes)) if rank not in values]
        raise TimeoutError(f"ranks {pending} did not finish within {timeout_s:.0f} s (killed)")


def _end(processes: list[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
