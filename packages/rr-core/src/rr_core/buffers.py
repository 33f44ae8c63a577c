"""Large CPU buffers.

A fresh buffer costs more than the copy that fills it: the kernel zeroes and maps each page on
first write (a 400 MB buffer's first write runs 2-10x slower than its second, measured on
shared CPU machines; numpy asks for transparent huge pages on arrays of 4 MiB and more, torch
2.13's CPU allocator does not, which helps only where the kernel grants them cheaply).

:func:`recycled` hands out the memory of a dropped buffer again instead: a rollout step decodes
a batch about the size of the last one, so from the second step on the batch lands in memory
that is already mapped. A buffer is reused only once nothing references it (CPython reference
counts: every view, tensor and storage made from it holds its owner), so a live batch is never
overwritten. At most :data:`IDLE_LIMIT` dropped buffers are kept; :func:`release` frees them.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import torch

Shape = int | tuple[int, ...]

#: Buffers below this size come from the allocator as usual (malloc already reuses them).
MIN_RECYCLED_BYTES = 16 << 20
#: Dropped buffers kept for reuse (two: one batch in training while the next is decoded).
IDLE_LIMIT = 2

_OWNERS: list[np.ndarray] = []  # every buffer handed out by recycled() and not yet released
_LOCK = threading.Lock()


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    return torch.empty(0, dtype=dtype).numpy().dtype


def empty(shape: Shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``; on the CPU a :func:`recycled`
    buffer."""
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    return torch.from_numpy(recycled(dims, _numpy_dtype(dtype)))


def zeros(shape: Shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``. Not ``np.zeros`` on the CPU: its
    pages are mapped lazily, so the first write into them faults page by page, and when that
    write is a torch op on several threads the faults contend (a 100 MB int16 buffer filled by
    ``copy_`` on 2 threads: 430 ms against 30 ms on one, and 21 + 8 ms after torch's zeroing
    pass, measured on this kind of machine)."""
    return torch.zeros(shape, dtype=dtype, device=device)


def _idle(i: int) -> bool:
    # references: the list's slot and getrefcount's argument; any view, tensor or storage made
    # from the buffer adds one
    return sys.getrefcount(_OWNERS[i]) == 2


def recycled(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An uninitialised numpy array (contents arbitrary, like ``np.empty``), in the memory of a
    dropped buffer of at least its size (at most twice) where one is idle."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < MIN_RECYCLED_BYTES:
        return np.empty(shape, dtype=dtype)
    with _LOCK:
        fits = [
            i for i in range(len(_OWNERS)) if nbytes <= _OWNERS[i].nbytes <= 2 * nbytes and _idle(i)
        ]
        if fits:
            owner = _OWNERS[min(fits, key=lambda i: _OWNERS[i].nbytes)]
        else:
            owner = np.empty(nbytes, dtype=np.uint8)
            _OWNERS.append(owner)
            idle = [i for i in range(len(_OWNERS) - 1) if _idle(i)]
            for i in reversed(idle[: max(0, len(idle) - IDLE_LIMIT)]):  # the oldest go first
                del _OWNERS[i]
        return owner[:nbytes].view(dtype).reshape(shape)


def release() -> int:
    """Free every idle buffer :func:`recycled` keeps; returns the bytes freed."""
    with _LOCK:
        idle = [i for i in range(len(_OWNERS)) if _idle(i)]
        freed = sum(_OWNERS[i].nbytes for i in idle)
        for i in reversed(idle):
            del _OWNERS[i]
    return freed
