"""The agreement tests of a replayed router call (:func:`rr_core.replay.topk.topk_set_and_order_T`)
compiled into one pass over the scores (numba, optional, as :mod:`rr_core.kernels` says).

Per row: the lowest score of the replayed set and whether its slots are in score order, then
the best score outside the set; the row agrees when that is no higher (a tie agrees), exactly
the torch path's formulas. The pass either writes both tests per row or, for the controller,
adds the counts of the rows inside the replay mask straight into the step's tally: on a CPU the
torch path's small ops (the tests, the mask, the tally's sums) cost far more than their data,
and a count kept on the host needs no sum at the step's end. Used for CPU float32 / float64
scores and int64 ids when the numba kernels run; the torch path otherwise.

Shapes: T rows, E experts, K top-k.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rr_core import kernels

_KERNEL: list[Callable[..., None]] = []


def _build() -> Callable[..., None]:
    def scan(scores_TE, ids_TK, mask_T, agree_T, in_order_T, hits_2):  # type: ignore[no-untyped-def]
        t_rows, e_experts = scores_TE.shape
        k_slots = ids_TK.shape[1]
        per_row = agree_T.shape[0] > 0
        masked = mask_T.shape[0] > 0
        chosen = np.zeros(e_experts, dtype=np.bool_)
        for t in range(t_rows):
            if masked and not mask_T[t]:
                continue
            floor = scores_TE[t, ids_TK[t, 0]]
            ordered = True
            for k in range(1, k_slots):
                value = scores_TE[t, ids_TK[t, k]]
                if value > scores_TE[t, ids_TK[t, k - 1]]:
                    ordered = False
                floor = min(floor, value)
            for k in range(k_slots):
                chosen[ids_TK[t, k]] = True
            agree = True
            for e in range(e_experts):
                if not chosen[e] and scores_TE[t, e] > floor:
                    agree = False
                    break
            for k in range(k_slots):
                chosen[ids_TK[t, k]] = False
            if per_row:
                agree_T[t] = agree
                in_order_T[t] = ordered
            elif agree:
                hits_2[0] += 1
                if ordered:
                    hits_2[1] += 1

    return kernels.compile_kernel(scan)  # type: ignore[no-any-return]


def _kernel() -> Callable[..., None]:
    if not _KERNEL:
        _KERNEL.append(_build())
    return _KERNEL[0]


def runs_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the compiled pass runs for scores of this device and dtype (int64 ids on the
    same device), read from what the caller already holds."""
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.float64)
        and kernels.kernel() == "numba"
    )


def topk_set_and_order_cpu(
    scores_TE: torch.Tensor, ids_TK: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The set and order tests of every row in one compiled pass, or None where the torch path
    runs (numba not running, scores off the CPU or of another dtype, ids not int64)."""
    if (
        not runs_on(scores_TE.device, scores_TE.dtype)
        or ids_TK.dtype != torch.int64
        or ids_TK.device.type != "cpu"
        or scores_TE.dim() != 2
    ):
        return None
    rows = scores_TE.shape[0]
    agree_T = torch.empty(rows, dtype=torch.bool)
    in_order_T = torch.empty(rows, dtype=torch.bool)
    out = (agree_T.numpy(), in_order_T.numpy(), np.zeros(2, dtype=np.int64))
    _kernel()(scores_TE.detach().numpy(), ids_TK.numpy(), kernels.EMPTY_BOOL, *out)
    return agree_T, in_order_T


def count_agreement(
    scores_TE: np.ndarray, ids_TK: np.ndarray, mask_T: np.ndarray | None, hits_2: np.ndarray
) -> None:
    """Add to ``hits_2`` (int64 ``[set agrees, set agrees and slots in order]``) the counts of
    the rows of ``mask_T`` (every row when None). Host arrays: scores of a dtype :func:`runs_on`
    accepts, ``[T, K]`` int64 ids in ``[0, E)``, a bool ``[T]`` mask."""
    _kernel()(
        scores_TE,
        ids_TK,
        kernels.EMPTY_BOOL if mask_T is None else mask_T,
        kernels.EMPTY_BOOL,  # no per-row output: counts only
        kernels.EMPTY_BOOL,
        hits_2,
    )
