"""Decoded ids of valid rows written into a caller's ``[X, L, K]`` layout.

Shape legend: V valid rows, M MoE slots, L layer slots, K top-k, X rows of the output.

Rows and slots that follow each other in the output are written as one slice copy per block of
(row run, slot run), which casts to the output's dtype on the way; a layout scattered into more
than :data:`MAX_BLOCKS` blocks takes one indexed assignment instead (fewer Python steps).
"""

from __future__ import annotations

import itertools

import torch

#: Above this many (row run, slot run) blocks, :func:`scatter_rows` assigns by index instead.
MAX_BLOCKS = 1 << 14


def runs(index_I: torch.Tensor) -> list[tuple[int, int]]:
    """``[first, stop)`` positions of each run of consecutive values (``i, i + 1, ...``) in a
    1-D int64 tensor."""
    if index_I.numel() == 0:
        return []
    breaks = ((index_I[1:] - index_I[:-1]) != 1).nonzero()[:, 0] + 1
    bounds = [0, *breaks.tolist(), index_I.numel()]
    return list(itertools.pairwise(bounds))


def scatter_rows(
    ids_VMK: torch.Tensor, out_XLK: torch.Tensor, rows_V: torch.Tensor | None, slots_M: torch.Tensor
) -> None:
    """``out_XLK[rows_V[v], slots_M[m]] = ids_VMK[v, m]`` (``rows_V`` None: row v), cast to the
    output's dtype; nothing else in ``out_XLK`` changes."""
    V, M = ids_VMK.shape[:2]
    if V == 0 or M == 0:
        return
    slots = slots_M.cpu()
    rows = None if rows_V is None else rows_V.cpu()
    slot_runs = runs(slots)
    row_runs = [(0, V)] if rows is None else runs(rows)
    if rows is not None and len(row_runs) * len(slot_runs) > MAX_BLOCKS:
        dev = out_XLK.device
        index_V1, index_1M = rows.to(dev)[:, None], slots_M.to(dev)[None, :]
        out_XLK[index_V1, index_1M] = ids_VMK.to(out_XLK.dtype)
        return
    for a, b in row_runs:
        x = a if rows is None else int(rows[a])
        for s, t in slot_runs:
            y = int(slots[s])
            out_XLK[x : x + b - a, y : y + t - s].copy_(ids_VMK[a:b, s:t])
