"""Checks of plain arguments (counts, ranks, lengths) shared by the public functions."""

from __future__ import annotations

import operator

from rr_core.errors import RRError


def as_index(value: object, what: str, error: type[RRError]) -> int:
    """``value`` as an int: Python and numpy / torch integer scalars qualify, bools and floats
    do not (``2.0`` would pass comparisons and then index something else)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise error(f"{what} must be an int; got {value!r} ({type(value).__name__})")
