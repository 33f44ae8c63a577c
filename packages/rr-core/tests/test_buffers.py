"""rr_core.buffers.recycled: the memory of dropped buffers is handed out again, a live buffer's
memory never is, and what is kept idle is bounded and can be freed."""

from __future__ import annotations

import gc
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rr_core import buffers

SIZE = 1 << 12


@pytest.fixture(autouse=True)
def small_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers, "MIN_RECYCLED_BYTES", SIZE)
    monkeypatch.setattr(buffers, "_OWNERS", [])


def test_a_dropped_buffer_is_reused_whatever_shape_and_dtype_come_next() -> None:
    a = buffers.recycled((SIZE // 8, 8), np.dtype(np.uint8))
    address = a.ctypes.data
    del a
    b = buffers.recycled((SIZE // 2,), np.dtype(np.uint16))
    assert b.ctypes.data == address
    assert (b.shape, b.dtype) == ((SIZE // 2,), np.uint16)


@pytest.mark.parametrize("keep", ["view", "tensor", "tensor_view", "storage", "numpy_of_tensor"])
def test_memory_reachable_from_anything_made_of_the_buffer_is_not_reused(keep: str) -> None:
    a = buffers.recycled((SIZE,), np.dtype(np.uint8))
    a.fill(7)
    t = torch.from_numpy(a)
    held = {
        "view": a[10:20],
        "tensor": t,
        "tensor_view": t[5:].view(torch.int8),
        "storage": t.untyped_storage(),
        "numpy_of_tensor": t[1:].numpy(),
    }[keep]
    del a, t
    gc.collect()
    b = buffers.recycled((SIZE,), np.dtype(np.uint8))
    b.fill(9)
    if isinstance(held, torch.UntypedStorage):
        held = torch.empty(0, dtype=torch.uint8).set_(held)
    assert (np.asarray(held).view(np.uint8) == 7).all()


def test_sizes_outside_one_to_two_times_get_a_new_buffer() -> None:
    a = buffers.recycled((4 * SIZE,), np.dtype(np.uint8))
    address = a.ctypes.data
    del a
    assert buffers.recycled((SIZE,), np.dtype(np.uint8)).ctypes.data != address  # < half
    assert buffers.recycled((8 * SIZE,), np.dtype(np.uint8)).ctypes.data != address  # larger
    assert buffers.recycled((3 * SIZE,), np.dtype(np.uint8)).ctypes.data == address


def test_small_buffers_are_not_kept() -> None:
    buffers.recycled((SIZE - 1,), np.dtype(np.uint8))
    assert buffers._OWNERS == []


def test_at_most_the_idle_limit_is_kept_and_release_frees_it() -> None:
    live = [buffers.recycled((SIZE * (i + 1),), np.dtype(np.uint8)) for i in range(5)]
    del live[:]
    buffers.recycled((64 * SIZE,), np.dtype(np.uint8))  # prunes the oldest idle ones
    kept = sorted(o.nbytes for o in buffers._OWNERS)
    assert kept == [4 * SIZE, 5 * SIZE, 64 * SIZE]
    assert buffers.release() == 4 * SIZE + 5 * SIZE + 64 * SIZE
    assert buffers._OWNERS == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 6)), min_size=1, max_size=30))
def test_live_buffers_never_overlap_and_keep_their_contents(ops: list[tuple[bool, int]]) -> None:
    """Take or drop buffers in any order: live ones never share a byte, nor change."""
    buffers._OWNERS.clear()
    live: list[tuple[np.ndarray, int]] = []
    for n, (take, size) in enumerate(ops):
        if take or not live:
            before = {o.ctypes.data for o in buffers._OWNERS}
            a = buffers.recycled((size * SIZE,), np.dtype(np.uint8))
            a.fill(n % 251)
            live.append((a, n % 251))
            del a
            if live[-1][0].ctypes.data not in before:  # a new buffer: the idle ones were pruned
                idle = sum(1 for i in range(len(buffers._OWNERS)) if buffers._idle(i))
                assert idle <= buffers.IDLE_LIMIT
        else:
            live.pop(size % len(live))
        spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a, _ in live)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
        assert all((a == mark).all() for a, mark in live)
