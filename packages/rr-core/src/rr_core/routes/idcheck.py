"""Vectorised per-row checks of top-k id rows, shared by route validation and replay arming.

Rows are ``[..., K]``. Byte ids on the CPU with K in {2, 4, 8} are checked a whole row-word at a
time (:mod:`rr_core.routes.idcheck_words`). Otherwise the K columns are first laid out contiguously
(``[K, R]``, one copy); reductions and comparisons along that layout are several times faster
than sorting each row or reducing over a strided last dimension.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rr_core.routes import idcheck_words as _idcheck_words


class RowFlags(NamedTuple):
    """Per row (flattened ``[...]``): an id outside ``[0, E)``; a repeated id; any non-zero id."""

    out_of_range_R: torch.Tensor
    repeated_R: torch.Tensor
    nonzero_R: torch.Tensor


def row_flags(ids_RK: torch.Tensor, num_experts: int) -> RowFlags:
    """Flags for every row of ``ids_RK`` (any integer dtype, any leading shape flattened)."""
    if _idcheck_words.covers(ids_RK):
        return RowFlags(*_idcheck_words.word_flags(ids_RK, num_experts))
    if num_experts <= 256 and _idcheck_words.covers_narrowed(ids_RK):
        return _wide_as_byte_flags(ids_RK, num_experts)
    return column_flags(ids_RK, num_experts)


def _wide_as_byte_flags(ids_RK: torch.Tensor, num_experts: int) -> RowFlags:
    """Wider ids of at most 256 experts (verl ships int16): narrowed to bytes and checked a
    row-word at a time; an id the narrowing changed (outside ``[0, 256)``) is out of range.
    About 3x faster than the column comparisons on int16, 10x on int64."""
    k = ids_RK.shape[-1]
    bytes_RK = ids_RK.to(torch.uint8)  # wraps ids outside [0, 256)
    out_of_range_R, repeated_R, nonzero_R = _idcheck_words.word_flags(bytes_RK, num_experts)
    changed_RK = bytes_RK.to(ids_RK.dtype) != ids_RK
    words = {2: torch.int16, 4: torch.int32, 8: torch.int64}[k]
    changed_R = changed_RK.reshape(-1, k).view(torch.uint8).view(words).reshape(-1) != 0
    return RowFlags(out_of_range_R | changed_R, repeated_R, nonzero_R | changed_R)


def column_flags(ids_RK: torch.Tensor, num_experts: int) -> RowFlags:
    """:func:`row_flags` by comparisons of contiguous id columns (any dtype and device)."""
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
