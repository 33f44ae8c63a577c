"""O(1) checks of public arguments (types, ndim, dtype kind, exact choices): shape and dtype
metadata only, never the values, so no check syncs with a device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rr_core import ReplayController, ReplayError, RRError
from rr_core.routes.args import as_index

__all__ = [
    "as_index",
    "check_choice",
    "check_controller",
    "check_flag",
    "check_model",
    "check_tensor",
]


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{value!r} ({type(value).__name__})"


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
        raise error(f"{what} must be a torch.Tensor; got {_describe(value)}")
    dims = value.dim()
    if (ndim is not None and dims != ndim) or dims < min_ndim:
        want = f"{ndim}" if ndim is not None else f">= {min_ndim}"
        raise error(f"{what} must have {want} dims; got {_describe(value)}")
    kind_ok = (
        not integer
        or (
            not value.dtype.is_floating_point
            and not value.dtype.is_complex
            and value.dtype is not torch.bool
        )
    ) and (not boolean or value.dtype is torch.bool)
    if not kind_ok:
        want = "an integer dtype (int16 / int32 / int64 / uint8)" if integer else "dtype bool"
        raise error(f"{what} must have {want}; got {_describe(value)}")
    return value


def check_choice(value: object, what: str, choices: Sequence[str], error: type[RRError]) -> str:
    """``value`` if it is exactly one of ``choices`` (strings only: no arrays, no enums)."""
    if not isinstance(value, str) or value not in choices:
        raise error(f"{what} must be one of {tuple(choices)}; got {_describe(value)}")
    return value


def check_flag(value: object, what: str, error: type[RRError]) -> bool:
    """A plain bool (a string such as ``"false"`` would be truthy)."""
    if not isinstance(value, bool):
        raise error(f"{what} must be True or False; got {_describe(value)}")
    return value


def check_controller(value: object, where: str) -> ReplayController:
    if not isinstance(value, ReplayController):
        raise ReplayError(
            f"{where} takes an rr_core.ReplayController as its controller; got "
            f"{_describe(value)}. Build one with rr_core.ReplayController(num_experts=E, top_k=K)"
        )
    return value


def check_model(value: object, where: str) -> Any:
    """An ``nn.Module`` or a non-empty sequence of them (VPP chunks)."""
    chunks = value if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    if not chunks or not all(isinstance(c, nn.Module) for c in chunks):
        raise ReplayError(
            f"{where} takes a torch.nn.Module or a list of model chunks (nn.Module each); got "
            f"{_describe(value)}"
        )
    return value
