"""The modes an attached router runs in, and the checks on what callers pass the controller.

Shapes: T tokens, L layer slots, K top-k.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Hashable, Iterable

import torch

from rr_core.errors import ReplayError


class ReplayMode(enum.Enum):
    """What an attached router does at its top-k step."""

    OFF = "off"  # native routing
    RECORD = "record"  # native routing, ids stored per micro-batch
    REPLAY = "replay"  # armed ids on valid rows, native routing on the others


_MODES = {mode.value: mode for mode in ReplayMode}
#: Integer dtypes arm() takes; the ids keep their dtype until a router widens its column.
ID_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {torch.uint16, torch.uint32, torch.uint64}
)


def as_mode(mode: object) -> ReplayMode:
    """``mode`` as a :class:`ReplayMode`: a member, or exactly a member's value (``"off"``,
    ``"record"``, ``"replay"``). Anything else raises: a mode that is not understood must never
    fall through to one of the others."""
    if isinstance(mode, ReplayMode):
        return mode
    if isinstance(mode, str) and mode in _MODES:
        return _MODES[mode]
    accepted = ", ".join(f"ReplayMode.{m.name} ({m.value!r})" for m in ReplayMode)
    raise ReplayError(f"mode must be one of {accepted}; got {mode!r} ({type(mode).__name__})")


def layer_numbers_of(layers: object, what: str) -> tuple[int, ...]:
    """``layers`` as a tuple of 1-based ints (numpy / torch integers allowed, bools not)."""
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise ReplayError(
            f"{what} must be a sequence of 1-based layer numbers; got {type(layers).__name__}"
        )
    items = tuple(layers)
    try:
        numbers = tuple(operator.index(n) for n in items if not isinstance(n, bool))
    except TypeError:
        numbers = ()
    if len(numbers) != len(items) or any(n < 1 for n in numbers):
        raise ReplayError(f"{what} must hold 1-based integer layer numbers; got {list(items)!r}")
    return numbers


def check_hashable(microbatch: object) -> None:
    """A micro-batch id: hashable, and not None (None is "no micro-batch scope": routers fire
    as micro-batch 0 there, so targets armed under None would never be found)."""
    if microbatch is None:
        raise ReplayError(
            "None is not a micro-batch id (outside any controller.microbatch() scope routers "
            "fire as micro-batch 0); use an int, a str or a tuple"
        )
    try:
        hash(microbatch)
    except TypeError:
        raise ReplayError(
            f"a micro-batch id must be hashable (an int, a str, a tuple); got "
            f"{type(microbatch).__name__} {microbatch!r}"
        ) from None


def check_routes(microbatch: Hashable, routes: object) -> None:
    """O(1) checks that ``routes`` is a dense integer tensor; the shape is checked by arm()."""
    if not isinstance(routes, torch.Tensor):
        hint = " (wrap it with torch.from_numpy)" if type(routes).__module__ == "numpy" else ""
        raise ReplayError(
            f"micro-batch {microbatch!r}: routes must be a torch.Tensor [T, L, K] of integer "
            f"expert ids; got {type(routes).__name__}{hint}"
        )
    if routes.is_nested or routes.layout != torch.strided:
        raise ReplayError(
            f"micro-batch {microbatch!r}: routes must be a dense (strided) [T, L, K] tensor; got "
            "a nested or sparse one (arm_batch takes jagged routes as a RouteBatch)"
        )
    if routes.dtype not in ID_DTYPES:
        raise ReplayError(
            f"micro-batch {microbatch!r}: routes must hold integer expert ids (an int or uint "
            f"dtype, uint8 where E <= 256); got {routes.dtype}. Float or bool routes are not ids: "
            "convert them where they are captured, not here"
        )


def unchecked_ids_error(
    target_TK: torch.Tensor, mask_T: torch.Tensor | None, num_experts: int
) -> str | None:
    """Why unchecked targets cannot be replayed (ids outside ``[0, E)``), or None."""
    ids_TK = target_TK.to(torch.int64)  # uint64 ids above int64 wrap negative: still flagged
    if mask_T is not None:
        ids_TK = ids_TK[mask_T.to(ids_TK.device)]
    bad = (ids_TK < 0) | (ids_TK >= num_experts)
    if not bool(bad.any()):
        return None
    lo, hi = (int(v) for v in torch.aminmax(ids_TK))
    return (
        f"armed ids span [{lo}, {hi}], outside [0, {num_experts}) ({int(bad.sum())} ids); "
        "they were armed with validate=False and never checked. Arm with validate=True, or "
        "validate the routes where they are captured"
    )
