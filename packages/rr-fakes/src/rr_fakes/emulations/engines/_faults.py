"""Knobs for the capture failures seen in the field (``failure-modes.md``, section E).

Shapes: N rows, L layer slots, K top-k, E experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.integer]


@dataclass(frozen=True, kw_only=True)
class Faults:
    """What goes wrong in an emulated engine output.

    - ``all_zero`` (E1): every id is 0, returned as if real (capturer bound too late,
      monolithic kernels, an NPU fork's release).
    - ``physical_map`` (E2): ids go through a logical -> physical table (``[E]``, or ``[L, E]``
      per layer slot) as under expert-load-balancing in vLLM 0.14-0.15.
    - ``uint8_overflow`` (E4): ids stored in 8 bits whatever E, so ids >= 256 wrap.
    - ``draft_layer0`` (E6): a draft / MTP model's ids (``[N, K]``, or a seed to draw them)
      overwrite layer slot 0 of the returned array.
    - ``abort_after_rows``: the request aborted; only that many rows come back and the finish
      reason is ``"abort"``.
    - ``missing`` (D3): routes come back as None (a flag not sent, capture off).
    - ``read_only``: returned arrays are not writeable (as ``np.frombuffer`` gives them).
    """

    all_zero: bool = False
    physical_map: IntArray | None = None
    uint8_overflow: bool = False
    draft_layer0: IntArray | int | None = None
    abort_after_rows: int | None = None
    missing: bool = False
    read_only: bool = False

    @property
    def aborted(self) -> bool:
        return self.abort_after_rows is not None


NO_FAULTS = Faults()


def cut_rows(routes_NLK: IntArray, faults: Faults) -> IntArray:
    """Keep the rows an aborted request still returns."""
    n = faults.abort_after_rows
    if n is None:
        return routes_NLK
    if not 0 <= n <= routes_NLK.shape[0]:
        raise ValueError(f"abort_after_rows={n} outside 0..{routes_NLK.shape[0]}")
    return routes_NLK[:n]


def corrupt_ids(routes_NLK: IntArray, faults: Faults) -> IntArray:
    """Apply E1 and E2 on the all-layers axis."""
    out: IntArray = np.array(routes_NLK, dtype=np.int64)
    if faults.physical_map is not None:
        table = np.asarray(faults.physical_map, dtype=np.int64)
        if table.ndim == 1:
            out = table[out]
        else:
            slots = np.arange(out.shape[1])[None, :, None]
            out = table[slots, out]
    if faults.all_zero:
        out = np.zeros_like(out)
    return out


def overwrite_layer0(routes_NLK: IntArray, faults: Faults, num_experts: int | None) -> IntArray:
    """Apply E6: slot 0 holds the draft model's ids."""
    draft = faults.draft_layer0
    if draft is None or routes_NLK.shape[0] == 0:
        return routes_NLK
    n, _, k = routes_NLK.shape
    if isinstance(draft, int):
        if num_experts is None:
            raise ValueError("a seeded draft_layer0 needs num_experts to draw ids from")
        rng = np.random.default_rng(draft)
        draft_NK: IntArray = np.stack([rng.permutation(num_experts)[:k] for _ in range(n)])
    else:
        draft_NK = np.asarray(draft)[:n]
    out = routes_NLK.copy()
    out[:, 0, :] = draft_NK
    return out


def faulted_rows(
    routes_NLK: IntArray, faults: Faults, start: int, num_experts: int | None
) -> IntArray:
    """The rows from ``start`` on as a faulty engine returns them: E1 / E2 ids, the rows an
    abort leaves, E6's draft ids in slot 0."""
    rows = cut_rows(corrupt_ids(routes_NLK, faults)[start:], faults)
    return overwrite_layer0(rows, faults, num_experts)


def finish(routes_NLK: IntArray, dtype: np.dtype[np.integer], faults: Faults) -> IntArray:
    """Cast to the era's dtype (E4 wraps into 8 bits) and apply ``read_only``."""
    if faults.uint8_overflow:
        wrapped = routes_NLK.astype(np.int64) & 0xFF
        narrow = dtype.itemsize < 4 and dtype.kind == "u"
        out = wrapped.astype(np.uint8 if narrow else dtype)
    else:
        out = np.ascontiguousarray(routes_NLK, dtype=dtype)
    if faults.read_only:
        out.setflags(write=False)
    return out
