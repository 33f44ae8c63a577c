"""The ids of a replaying router call on the CPU in one compiled pass (numba, optional, as
:mod:`rr_core.kernels` says): each row's armed ids, read through the arming's row index, or a
top-k of the row's scores where the replay mask leaves it native.

The torch path (:func:`rr_core.replay.topk.replay_checked`) takes the layer's slot, widens it,
selects the native rows, ranks them, merges them back: on a CPU each of those small ops costs
more than its data, and R3 always has a mask. This pass writes the int64 ids the router's
gather takes, reading each armed id once. It gives the torch path's ids bit for bit but where
a native row's top-k ties: equal scores rank the lower expert id first (``torch.topk`` leaves
that order unspecified), and NaN ranks above every number, as in ``torch.topk``.

Used by the controller for CPU float32 / float64 scores and armed ids it checked (in range,
distinct) on the CPU, when the numba kernels run.

Shapes: T rows the router sees, R armed rows, L layer slots, E experts, K top-k.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rr_core import kernels
from rr_core.errors import ReplayError

_KERNEL: list[Callable[..., int]] = []
#: The id dtypes the pass reads (numpy views of the armed tensor).
ID_DTYPES = frozenset({torch.uint8, torch.int16, torch.int32, torch.int64})


def _build() -> Callable[..., int]:
    def replay_ids(scores_TE, routes_RLK, slot, rows_T, mask_T, ids_TK):  # type: ignore[no-untyped-def]
        t_rows, e_experts = scores_TE.shape
        k_slots = ids_TK.shape[1]
        masked = mask_T.shape[0] > 0
        by_rows = rows_T.shape[0] > 0
        best = np.empty(k_slots, dtype=scores_TE.dtype)
        for t in range(t_rows):
            if not masked or mask_T[t]:
                r = rows_T[t] if by_rows else t
                for k in range(k_slots):
                    v = routes_RLK[r, slot, k]
                    if v < 0 or v >= e_experts:  # the gather would read out of bounds
                        return t
                    ids_TK[t, k] = v
                continue
            # native: insertion into the K best so far (a strictly better score moves past an
            # equal one, so ties keep the lower id first; NaN is better than any number)
            n = 0
            for e in range(e_experts):
                v = scores_TE[t, e]
                j = n
                while j > 0:
                    w = best[j - 1]
                    if v > w or (v != v and w == w):
                        j -= 1
                    else:
                        break
                if j >= k_slots:
                    continue
                last = min(n, k_slots - 1)
                for i in range(last, j, -1):
                    best[i] = best[i - 1]
                    ids_TK[t, i] = ids_TK[t, i - 1]
                best[j] = v
                ids_TK[t, j] = e
                n = min(n + 1, k_slots)
        return -1

    return kernels.compile_kernel(replay_ids)  # type: ignore[no-any-return]


def _kernel() -> Callable[..., int]:
    if not _KERNEL:
        _KERNEL.append(_build())
    return _KERNEL[0]


def replay_ids_cpu(
    scores_TE: np.ndarray,
    routes_RLK: np.ndarray,
    slot: int,
    rows_T: np.ndarray | None,
    mask_T: np.ndarray | None,
    k: int,
) -> np.ndarray:
    """int64 ``[T, k]`` ids: ``routes_RLK[rows_T[t], slot]`` (row t when ``rows_T`` is None)
    where ``mask_T`` holds (every row when None), the top-k of ``scores_TE[t]`` elsewhere,
    slot 0 scoring highest. Arrays on the host: scores ``[T, E]`` float32 / float64, armed ids
    checked for the rows that replay, an int64 row index into them, a bool mask. An armed id
    outside ``[0, E)`` raises :class:`ReplayError` (never an id the gather cannot take)."""
    ids_TK = np.empty((scores_TE.shape[0], k), dtype=np.int64)
    bad = _kernel()(
        scores_TE,
        routes_RLK,
        slot,
        kernels.EMPTY_INT64 if rows_T is None else rows_T,  # row t replays armed row t
        kernels.EMPTY_BOOL if mask_T is None else mask_T,  # every row replays
        ids_TK,
    )
    if bad >= 0:  # as the torch path's gather, answered as it answers: by name
        e = scores_TE.shape[1]
        row = int(bad if rows_T is None else rows_T[bad])
        ids = routes_RLK[row, slot].tolist()
        raise ReplayError(
            f"router row {bad} replays armed ids {ids}, outside [0, {e}): ids armed without "
            "a check here (validate=False) were not in range, or a checked batch was edited "
            "after it was armed. Arm with validate=True, or validate the routes where they "
            "are captured"
        )
    return ids_TK
