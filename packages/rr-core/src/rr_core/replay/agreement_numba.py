"""The agreement tests of a replayed router call (:func:`rr_core.replay.topk.topk_set_and_order_T`)
compiled into one pass over the scores (numba, optional, as :mod:`rr_core.kernels` says).

Per row: the lowest score of the replayed set and whether its slots are in score order, then
the best score outside the set; the row agrees when that is no higher (a tie agrees), exactly
the torch path's formulas. On a CPU the torch path's eight small ops cost far more than their
data (about 100 us for 512 rows of 32 experts); this pass costs about a tenth of it. Used for
CPU float32 / float64 scores and int64 ids when the numba kernels run; the torch path
otherwise.

Shapes: T rows, E experts, K top-k.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rr_core import kernels

_KERNEL: list[Callable[..., None]] = []


def _build() -> Callable[..., None]:
    def scan(scores_TE, ids_TK, agree_T, in_order_T):  # type: ignore[no-untyped-def]
        t_rows, e_experts = scores_TE.shape
        k_slots = ids_TK.shape[1]
        chosen = np.zeros(e_experts, dtype=np.bool_)
        for t in range(t_rows):
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
            agree_T[t] = agree
            in_order_T[t] = ordered

    return kernels.compile_kernel(scan)  # type: ignore[no-any-return]


def topk_set_and_order_cpu(
    scores_TE: torch.Tensor, ids_TK: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The set and order tests in one compiled pass, or None where the torch path runs
    (numba not running, scores off the CPU or of another dtype, ids not int64)."""
    if (
        scores_TE.device.type != "cpu"
        or scores_TE.dtype not in (torch.float32, torch.float64)
        or ids_TK.dtype != torch.int64
        or ids_TK.device.type != "cpu"
        or scores_TE.dim() != 2
        or kernels.kernel() != "numba"
    ):
        return None
    if not _KERNEL:
        _KERNEL.append(_build())
    rows = scores_TE.shape[0]
    agree_T = torch.empty(rows, dtype=torch.bool)
    in_order_T = torch.empty(rows, dtype=torch.bool)
    _KERNEL[0](
        scores_TE.detach().contiguous().numpy(),
        ids_TK.contiguous().numpy(),
        agree_T.numpy(),
        in_order_T.numpy(),
    )
    return agree_T, in_order_T
