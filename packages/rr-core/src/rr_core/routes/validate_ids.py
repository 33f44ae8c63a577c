"""The id checks of a route batch; each error names sequence, token row, layer number and ids.

Shape legend: N total token rows, R rows of one block, B sequences, L layer slots, M MoE slots,
K top-k. Rows are scanned in blocks of about ``_BLOCK_IDS`` ids. Each block's per-row flags are
computed where the ids live (:func:`rr_core.routes.idcheck.row_flags`, one flag per row and slot, so
only 1/K of the ids' count crosses to the host); masks, counts and per-sequence reductions run on
the host in numpy, several times faster on CPU than torch's boolean reductions.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from rr_core.errors import RouteValidationError
from rr_core.routes.idcheck import row_flags

if TYPE_CHECKING:
    from rr_core.routes.meta import RouteMeta

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]

# Rows are checked in blocks of about this many ids, so that the flags of a multi-gigabyte batch
# stay small.
_BLOCK_IDS = 1 << 24


class Block(NamedTuple):
    """Rows ``[start, stop)`` and their flags per row and slot."""

    start: int
    stop: int
    out_of_range_RL: BoolArray
    repeated_RL: BoolArray
    nonzero_RL: BoolArray


def _where(offsets: list[int], row: int) -> str:
    b = bisect_right(offsets, row) - 1
    return f"sequence {b}, token row {row - offsets[b]} (global row {row})"


def _host(flags: torch.Tensor) -> BoolArray:
    return flags.cpu().numpy()


class _Hits:
    """First offending (row, slot) and the count of offending row-slot pairs, across blocks."""

    def __init__(self) -> None:
        self.first: tuple[int, int] | None = None
        self.count = 0

    def add(self, bad_RX: BoolArray, start: int) -> None:
        n = int(np.count_nonzero(bad_RX))
        if n and self.first is None:
            row, slot = divmod(int(np.argmax(bad_RX)), bad_RX.shape[1])
            self.first = (start + row, slot)
        self.count += n


def _segments(offsets_B1: IntArray, start: int, stop: int) -> tuple[IntArray, IntArray]:
    """``(sequences, first rows relative to start)`` of the non-empty parts of sequences within
    rows ``[start, stop)``, for ``np.logical_or.reduceat`` (which needs no empty segments)."""
    lo = np.maximum(offsets_B1[:-1], start)
    hi = np.minimum(offsets_B1[1:], stop)
    seqs = np.flatnonzero(lo < hi)
    return seqs, lo[seqs] - start


def _scan_blocks(values_NLK: torch.Tensor, num_experts: int) -> Iterator[Block]:
    """The row flags of each block of rows, ``[R, L]`` each (fresh arrays)."""
    N, L, K = values_NLK.shape
    step = max(1, _BLOCK_IDS // (L * K))
    for start in range(0, N, step):
        stop = min(N, start + step)
        flags = row_flags(values_NLK[start:stop], num_experts)
        yield Block(start, stop, *(_host(f).reshape(stop - start, L) for f in flags))


def _on_valid_moe(flags_RL: BoolArray, moe: list[int] | None, invalid_R: IntArray) -> BoolArray:
    """The flags of the MoE slots (all slots for None), cleared on invalid rows, in place where
    no slot is left out (the flags are fresh arrays; there are few invalid rows)."""
    out_RL = flags_RL if moe is None else flags_RL[:, moe]
    out_RL[invalid_R] = False
    return out_RL


def _routed_slots(
    values_NLK: torch.Tensor,
    meta: RouteMeta,
    valid: BoolArray,
    offsets: IntArray,
    moe: list[int] | None,
) -> BoolArray:
    """``[B, M]``: whether sequence b's MoE slot m holds a non-zero id on some valid row."""
    routed_BM = np.zeros((len(offsets) - 1, len(meta.moe_slots)), dtype=bool)
    for block in _scan_blocks(values_NLK, meta.num_experts):
        invalid_R = np.flatnonzero(~valid[block.start : block.stop])
        nz_RL = _on_valid_moe(block.nonzero_RL, moe, invalid_R)
        seqs, firsts = _segments(offsets, block.start, block.stop)
        routed_BM[seqs] |= np.logical_or.reduceat(nz_RL, firsts, axis=0)
    return routed_BM


def check_ids(
    values_NLK: torch.Tensor,
    offsets_B1: torch.Tensor,
    valid_N: torch.Tensor,
    meta: RouteMeta,
    *,
    allow_all_zero: bool = False,
) -> None:
    """Dense slots hold zeros on every row; on valid rows each MoE slot holds K distinct ids in
    ``[0, E)``; no MoE slot is zero on every valid row of a sequence (E1) unless allowed.

    Errors are reported in that order, E1 before repeats since a zero row also repeats id 0.
    With K >= 2 every all-zero row repeats an id, so only a batch with repeats is searched for
    E1 (a second pass); a clean batch costs the flags and a quick ``any`` over each.
    """
    N, _, K = values_NLK.shape
    if N == 0:
        return
    offsets = offsets_B1.tolist()
    offsets_np = np.asarray(offsets, dtype=np.intp)
    layers, E = meta.layer_numbers, meta.num_experts
    dense, moe_slots = list(meta.dense_slots), list(meta.moe_slots)
    moe = moe_slots if dense else None  # None: every slot, no copy of the flags
    valid = _host(valid_N)
    nonzero, outside, repeated = _Hits(), _Hits(), _Hits()
    for block in _scan_blocks(values_NLK, E):
        if dense:  # on every row, valid or not
            nonzero.add(block.nonzero_RL[:, dense], block.start)
        invalid_R = np.flatnonzero(~valid[block.start : block.stop])
        out_RL = _on_valid_moe(block.out_of_range_RL, moe, invalid_R)
        rep_RL = _on_valid_moe(block.repeated_RL, moe, invalid_R)
        if out_RL.any():
            outside.add(out_RL, block.start)
        if rep_RL.any():
            repeated.add(rep_RL, block.start)
    routed_BM = None
    if not allow_all_zero and (K == 1 or repeated.count):
        routed_BM = _routed_slots(values_NLK, meta, valid, offsets_np, moe)

    def first_pair(found: _Hits, slots: list[int]) -> str:
        """Where the first row-layer pair found lies, and its ids."""
        assert found.first is not None
        row, j = found.first
        slot = slots[j]
        kind, ids = (", dense", "ids") if slots is dense else ("", "expert ids")
        where = f"{_where(offsets, row)}, layer {layers[slot]} (slot {slot}{kind})"
        return f"{where}: {ids} {values_NLK[row, slot].tolist()}"

    if nonzero.first is not None:
        raise RouteValidationError(
            f"{first_pair(nonzero, dense)} are non-zero, but a dense layer has no route and "
            f"must hold zeros; {nonzero.count} row-layer pair(s) affected. The layer axis is "
            "probably shifted or meta.moe_layer_numbers is wrong"
        )
    if outside.first is not None:
        raise RouteValidationError(
            f"{first_pair(outside, moe_slots)} are outside [0, {E}) for num_experts={E}; "
            f"{outside.count} row-layer pair(s) affected. Physical instead of logical ids (E2), "
            "or a wrong num_experts? See `rr explain E2`"
        )
    if routed_BM is not None:
        counted = np.concatenate([[0], np.cumsum(valid, dtype=np.int64)])
        valid_B = counted[offsets_np[1:]] - counted[offsets_np[:-1]]
        dead_BM = ~routed_BM & (valid_B > 0)[:, None]
        if dead_BM.any():
            b, j = divmod(int(np.argmax(dead_BM)), dead_BM.shape[1])
            first = int(np.argmax(valid[offsets[b] : offsets[b + 1]]))
            hint = (
                ", or pass allow_all_zero=True if these routes are genuine"
                if K == 1
                else f" (with top_k={K} a zero row repeats id 0, so it cannot be a real route)"
            )
            slot = moe_slots[j]
            raise RouteValidationError(
                f"sequence {b}, layer {layers[slot]} (slot {slot}): expert ids are all zero "
                f"on all {int(valid_B[b])} valid rows (from token row {first}), the signature of "
                f"a capture that zero-filled its routes (E1); {int(dead_BM.sum())} "
                f"sequence-layer pair(s) affected. Fix the capture{hint}; see `rr explain E1`"
            )
    if repeated.first is not None:
        raise RouteValidationError(
            f"{first_pair(repeated, moe_slots)} repeat an id; a valid row needs top_k={K} "
            f"distinct ids; {repeated.count} row-layer pair(s) affected"
        )
