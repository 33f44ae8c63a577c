"""Splitting row loops across threads. numpy ufuncs and torch CPU kernels release the GIL, so a
loop of whole-array operations over disjoint row ranges runs in parallel in plain threads.

The thread count follows ``torch.get_num_threads()``, the knob users already set for CPU work.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import TypeVar

import torch

T = TypeVar("T")

# Keyed by process too: a forked child inherits the pool object but not its threads.
_POOL: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    key = (os.getpid(), workers)
    if key not in _POOL:
        _POOL[key] = ThreadPoolExecutor(workers, thread_name_prefix="rr-core")
    return _POOL[key]


def over_ranges(total: int, unit: int, work: Callable[[int, int], T]) -> list[T]:
    """``[work(start, stop) ...]`` over consecutive ranges covering ``[0, total)``, each a
    multiple of ``unit`` rows long but the last, one range per thread (in order)."""
    units = -(-total // unit)
    workers = max(1, min(torch.get_num_threads(), units))
    if workers == 1:
        return [work(0, total)]
    bounds = [min(total, (units * i // workers) * unit) for i in range(workers + 1)]
    return list(_pool(workers).map(lambda r: work(*r), pairwise(bounds)))
