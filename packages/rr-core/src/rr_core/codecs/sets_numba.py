"""The ranking of :mod:`rr_core.codecs.sets_fast` compiled (numba, optional): each row's 8 ids
sorted by the same merge network in registers and ranked by the same pair tables, so the ranks
are equal bit for bit; one pass per block instead of some forty numpy passes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rr_core.routes import idcheck_numba, idcheck_words

_KERNEL: list[Callable[..., bool]] = []


def enabled() -> bool:
    """Whether the compiled ranking runs (numba imports and the numpy kernels are not chosen:
    ``RR_IDCHECK_KERNEL=numpy`` turns every compiled kernel off)."""
    return idcheck_words.kernel() == "numba"


def _build() -> Callable[..., bool]:
    numba = idcheck_numba.numba_module()

    def rank(src_RK, first, n, shift, tables, dup, acc):  # type: ignore[no-untyped-def]
        """Ranks of rows ``[first, first + n)`` into ``acc``; False on a repeated id."""
        for r in range(n):
            row = src_RK[first + r]
            c0, c1, c2, c3 = row[0], row[1], row[2], row[3]
            c4, c5, c6, c7 = row[4], row[5], row[6], row[7]
            # Batcher's odd-even merge network of sets_fast._NETWORK, pair by pair
            c0, c1 = min(c0, c1), max(c0, c1)
            c2, c3 = min(c2, c3), max(c2, c3)
            c4, c5 = min(c4, c5), max(c4, c5)
            c6, c7 = min(c6, c7), max(c6, c7)
            c0, c2 = min(c0, c2), max(c0, c2)
            c1, c3 = min(c1, c3), max(c1, c3)
            c4, c6 = min(c4, c6), max(c4, c6)
            c5, c7 = min(c5, c7), max(c5, c7)
            c1, c2 = min(c1, c2), max(c1, c2)
            c5, c6 = min(c5, c6), max(c5, c6)
            c0, c4 = min(c0, c4), max(c0, c4)
            c1, c5 = min(c1, c5), max(c1, c5)
            c2, c6 = min(c2, c6), max(c2, c6)
            c3, c7 = min(c3, c7), max(c3, c7)
            c2, c4 = min(c2, c4), max(c2, c4)
            c3, c5 = min(c3, c5), max(c3, c5)
            c1, c2 = min(c1, c2), max(c1, c2)
            c3, c4 = min(c3, c4), max(c3, c4)
            c5, c6 = min(c5, c6), max(c5, c6)
            if c1 == c2 or c3 == c4 or c5 == c6:
                return False
            total = (
                tables[0, np.int64(c0) | (np.int64(c1) << shift)]
                + tables[1, np.int64(c2) | (np.int64(c3) << shift)]
                + tables[2, np.int64(c4) | (np.int64(c5) << shift)]
                + tables[3, np.int64(c6) | (np.int64(c7) << shift)]
            )
            if total >= dup:  # a pair inside a table repeats an id
                return False
            acc[r] = total
        return True

    options = {"nogil": True, "boundscheck": False}
    try:
        return numba.njit(cache=True, **options)(rank)  # type: ignore[no-any-return]
    except RuntimeError:  # no writable cache location
        return numba.njit(**options)(rank)  # type: ignore[no-any-return]


def rank_rows(
    src_RK: np.ndarray,
    first: int,
    n: int,
    shift: int,
    tables: np.ndarray,
    dup: int,
    acc: np.ndarray,
) -> bool:
    """Ranks int64 of uint8 rows ``src_RK[first : first + n]`` into ``acc[:n]``; False if a
    row repeats an id (``acc`` then holds garbage)."""
    if not _KERNEL:
        _KERNEL.append(_build())
    return bool(_KERNEL[0](src_RK, first, n, shift, tables, np.int64(dup), acc))
