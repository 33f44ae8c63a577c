"""Vectorised per-row checks of top-k id rows, shared by route validation and replay arming.

Rows are ``[..., K]``. The K columns are first laid out contiguously (``[K, R]``, one copy);
reductions and comparisons along that layout are several times faster on CPU than sorting each
row or reducing over a strided last dimension.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RowFlags(NamedTuple):
    """Per row (flattened ``[...]``): an id outside ``[0, E)``; a repeated id; any non-zero id."""

    out_of_range_R: torch.Tensor
    repeated_R: torch.Tensor
    nonzero_R: torch.Tensor


def row_flags(ids_RK: torch.Tensor, num_experts: int) -> RowFlags:
    """Flags for every row of ``ids_RK`` (any integer dtype, any leading shape flattened)."""
    k = ids_RK.shape[-1]
    ids_KR = ids_RK.reshape(-1, k).t().contiguous()
    high_R, low_R = ids_KR.amax(dim=0), ids_KR.amin(dim=0)
    if num_experts <= torch.iinfo(ids_KR.dtype).max:
        out_of_range_R = high_R >= num_experts
    else:  # the dtype cannot hold an id >= E (and E itself would wrap in the comparison)
        out_of_range_R = torch.zeros_like(high_R, dtype=torch.bool)
    nonzero_R = high_R != 0
    if ids_KR.dtype.is_signed:
        out_of_range_R |= low_R < 0
        nonzero_R |= low_R != 0
    repeated_R = torch.zeros_like(out_of_range_R)
    for i in range(k):  # K(K-1)/2 contiguous comparisons; K is a top-k, so small
        for j in range(i + 1, k):
            repeated_R |= ids_KR[i] == ids_KR[j]
    return RowFlags(out_of_range_R, repeated_R, nonzero_R)
