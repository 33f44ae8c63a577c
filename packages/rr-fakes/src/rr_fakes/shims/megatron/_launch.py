"""Run a function in N processes on one machine, each rank a gloo member (and, optionally, a
Megatron model-parallel rank), and fail loudly: the first rank that raises fails the call with
its own traceback, a hard timeout ends hung collectives, and no process outlives the call.

Ranks are forked by multiprocessing's fork server, which imports torch (and, where installed,
megatron-core under the CPU harness) once per test process: a spawned rank spent about 8 s of
its start re-importing them. The server is a clean single-threaded process, so forking it is
safe where forking a test process that has run torch's thread pools is not. Each rank takes the
caller's environment and working directory as they are at the call, as a spawned one would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from rr_fakes.shims.megatron._dist import ParallelSizes, free_port, gloo_group, model_parallel


class RankFailedError(RuntimeError):
    """A launched rank raised or died; the message carries its rank and traceback."""

    def __init__(self, rank: int, detail: str) -> None:
        super().__init__(f"rank {rank} failed:\n{detail}")
        self.rank, self.detail = rank, detail


#: What the fork server imports before it forks a rank (each module's own import guards what
#: is not installed).
PRELOAD = ("rr_fakes.shims.megatron._preload",)


def _context() -> Any:
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # read when the server first starts
    return context


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    sizes: ParallelSizes | None,
    results: Any,
    caller: tuple[dict[str, str], str],
) -> None:
    environ, cwd = caller  # the server's were the caller's when it started, not now
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    import torch

    torch.set_num_threads(1)  # N ranks share the machine's cores
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
    try:
        with gloo_group(rank, world_size, port=port):
            try:
                if sizes is None:
                    value = fn(*args)
                else:
                    with model_parallel(sizes):
                        value = fn(*args)
            except BaseException:
                # Report before the group is torn down: peers then fail too, and the time
                # stamp tells the parent whose failure came first.
                results.put((rank, False, traceback.format_exc(), time.time()))
                return
        results.put((rank, True, value, time.time()))
    except BaseException:
        results.put((rank, False, traceback.format_exc(), time.time()))


#: How often a launch whose rendezvous port was taken is tried on another port.
PORT_TRIES = 3


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    sizes: ParallelSizes | None = None,
    timeout_s: float = 120.0,
) -> list[Any]:
    """Call ``fn(*args)`` on ranks 0..world_size-1 (forked processes) and return their
    results by rank. With ``sizes`` each rank runs inside :func:`model_parallel` (the CPU
    harness and Megatron's parallel state). ``fn``, ``args`` and results must pickle; define
    ``fn`` at module level. The rendezvous port is one the OS found free; where another
    process binds it before rank 0 does (parallel test workers), the launch runs again on
    another port: no rank ran ``fn`` then, since none joined the group."""
    if not 1 <= world_size <= 8:
        raise ValueError(f"world_size must be in 1..8; got {world_size}")
    for attempt in range(1, PORT_TRIES + 1):
        try:
            return _launch_once(fn, world_size, args, sizes, timeout_s, free_port())
        except RankFailedError as e:
            if attempt == PORT_TRIES or not _port_taken(e):
                raise
    raise AssertionError("unreachable")


def _port_taken(error: RankFailedError) -> bool:
    """Rank 0 could not listen on the rendezvous port (it was taken since it was found)."""
    return error.rank == 0 and "EADDRINUSE" in error.detail and "TCPStore" in error.detail


def _launch_once(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...],
    sizes: ParallelSizes | None,
    timeout_s: float,
    port: int,
) -> list[Any]:
    context = _context()
    results = context.Queue()
    caller = (dict(os.environ), os.getcwd())
    processes = [
        context.Process(
            target=_rank_main,
            args=(rank, world_size, port, fn, args, sizes, results, caller),
            name=f"rr-rank{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        for process in processes:
            process.start()
        while len(values) < world_size:
            try:
                rank, ok, value, stamp = results.get(timeout=0.2)
            except queue.Empty:
                _check_alive(processes, values, deadline, timeout_s)
                continue
            if not ok:
                raise _first_failure(results, (stamp, rank, value))
            values[rank] = value
    finally:
        _end(processes)
        results.close()
    return [values[rank] for rank in range(world_size)]


def _first_failure(results: Any, first: tuple[float, int, str]) -> RankFailedError:
    """The failure that happened first: once one rank fails its peers fail in collectives,
    and their reports may arrive earlier. Waits briefly for those reports."""
    failures = [first]
    grace = time.monotonic() + 2.0
    while time.monotonic() < grace:
        try:
            rank, ok, value, stamp = results.get(timeout=0.1)
        except queue.Empty:
            continue
        if not ok:
            failures.append((stamp, rank, value))
    _, rank, detail = min(failures)
    others = sorted(r for _, r, _ in failures if r != rank)
    if others:
        detail += f"\n(ranks {others} failed after it)"
    return RankFailedError(rank, detail)


def _check_alive(
    processes: list[Any], values: dict[int, Any], deadline: float, timeout_s: float
) -> None:
    for rank, process in enumerate(processes):
        if rank not in values and process.exitcode is not None and process.exitcode != 0:
            raise RankFailedError(
                rank, f"process exited with code {process.exitcode} and no traceback"
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
