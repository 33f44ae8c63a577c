"""Row loops split across threads: every row once, in unit-aligned ranges, and still working in
a forked child (a data-loader worker) after the parent used the pool."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

import pytest

from rr_core.threads import over_ranges


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("total", "unit"), [(0, 8), (1, 8), (8, 8), (17, 8), (1000, 64)])
def test_ranges_cover_every_row_once(
    threads: int, total: int, unit: int, torch_threads: Callable[[int], None]
) -> None:
    torch_threads(threads)
    ranges = over_ranges(total, unit, lambda a, b: (a, b))
    assert [a for a, _ in ranges] == [0] + [b for _, b in ranges[:-1]]  # in order, no gap
    assert ranges[-1][1] == total
    assert all(a % unit == 0 for a, _ in ranges)
    assert len(ranges) <= max(1, threads)


def _child(queue: multiprocessing.Queue[list[tuple[int, int]]]) -> None:
    queue.put(over_ranges(64, 8, lambda a, b: (a, b)))


def test_pool_works_in_a_forked_child(torch_threads: Callable[[int], None]) -> None:
    torch_threads(2)
    assert len(over_ranges(64, 8, lambda a, b: (a, b))) == 2  # the parent's pool exists now
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[list[tuple[int, int]]] = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=30) == [(0, 32), (32, 64)]
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
