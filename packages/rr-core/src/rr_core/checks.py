"""O(1) checks of public arguments (types, ndim, dtype kind, exact choices), one home for every
package: shape and dtype metadata only, never the values, so no check syncs with a device.
Each raises the error class the caller names, with what was expected and what came."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from rr_core.errors import RRError

__all__ = [
    "as_index", "check_choice", "check_flag", "check_instance", "check_sequence", "check_tensor",
    "describe",
]  # fmt: skip

T = TypeVar("T")


def describe(value: object) -> str:
    """A value as an error message names it: a tensor by dtype and shape, the rest by repr."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{text if len(text) <= 200 else text[:197] + '...'} ({type(value).__name__})"


def as_index(value: object, what: str, error: type[RRError]) -> int:
    """``value`` as an int: Python and numpy / torch integer scalars qualify, bools and floats
    do not (``2.0`` would pass comparisons and then index something else)."""
    if not isinstance(value, bool) and getattr(value, "dtype", None) is not torch.bool:
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise error(f"{what} must be an int; got {value!r} ({type(value).__name__})")


def check_tensor(
    value: object,
    what: str,
    error: type[RRError],
    *,
    ndim: int | None = None,
    min_ndim: int = 0,
    integer: bool = False,
    boolean: bool = False,
) -> torch.Tensor:
    """``value`` as a tensor with ``ndim`` (or at least ``min_ndim``) dims; ``integer``: an
    integer dtype (not bool, not float); ``boolean``: a bool dtype."""
    if not isinstance(value, torch.Tensor):
        raise error(f"{what} must be a torch.Tensor; got {describe(value)}")
    dims = value.dim()
    if (ndim is not None and dims != ndim) or dims < min_ndim:
        want = f"{ndim}" if ndim is not None else f">= {min_ndim}"
        raise error(f"{what} must have {want} dims; got {describe(value)}")
    dtype = value.dtype
    is_integer = not (dtype.is_floating_point or dtype.is_complex or dtype is torch.bool)
    if (integer and not is_integer) or (boolean and dtype is not torch.bool):
        want = "an integer dtype (int16 / int32 / int64 / uint8)" if integer else "dtype bool"
        raise error(f"{what} must have {want}; got {describe(value)}")
    return value


def check_choice(value: object, what: str, choices: Sequence[str], error: type[RRError]) -> str:
    """``value`` as a plain str if it is exactly one of ``choices`` (strings only: an array or
    a list must not be compared element by element)."""
    if isinstance(value, str) and value in choices:
        return str(value)
    raise error(f"{what} must be one of {', '.join(map(repr, choices))}; got {describe(value)}")


def check_flag(value: object, what: str, error: type[RRError]) -> bool:
    """A plain bool (a string such as ``"false"`` would be truthy)."""
    if not isinstance(value, bool):
        raise error(f"{what} must be True or False; got {describe(value)}")
    return value


def check_instance(
    value: object, kind: type[T], error: type[RRError], takes: str, fix: str = ""
) -> T:
    """``value`` if it is a ``kind``; else ``error``: "<takes>; got <what came><fix>" (``takes``
    names the caller and what it takes, ``fix`` how to get one)."""
    if isinstance(value, kind):
        return value
    raise error(f"{takes}; got {describe(value)}{fix}")


def check_sequence(
    value: object,
    what: str,
    error: type[RRError],
    of: type | tuple[type, ...] | None = None,
) -> list[Any]:
    """``value``'s items as a list when it is a sequence (a list, a tuple), each an ``of`` when
    given. A string, bytes, a mapping, a tensor or an array is not taken for one: read item by
    item each would give something else than the caller meant."""
    if isinstance(value, str | bytes | Mapping | torch.Tensor | np.ndarray) or not isinstance(
        value, Sequence
    ):
        raise error(f"{what} must be a list; got {describe(value)}")
    items = list(value)
    if of is not None:
        kinds = of if isinstance(of, tuple) else (of,)
        for i, item in enumerate(items):
            if not isinstance(item, kinds):
                names = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
                raise error(f"{what}[{i}] must be {names}; got {describe(item)}")
    return items
