"""The checks on what callers pass the controller: micro-batch ids, layer numbers, routes and
their row index and mask, a custom walk's pairs, the ids of replay targets. Each raises
:class:`~rr_core.errors.ReplayError` naming what was expected and what came.

Shapes: T tokens (rows a router sees), R armed source rows, L layer slots, K top-k.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from rr_core import kernels
from rr_core.errors import ReplayError
from rr_core.routes import idcheck_numba, idcheck_words
from rr_core.routes.idcheck import row_flags

#: Integer dtypes arm() takes; the ids keep their dtype until a router widens its column.
ID_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {torch.uint16, torch.uint32, torch.uint64}
)
# uint64 ids above the int64 range wrap negative, so they are still out of range.
_WIDEN = {torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64}


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


def check_rows(microbatch: Hashable, rows_T: object, routes_RLK: torch.Tensor) -> None:
    """``rows_T`` is an int64 ``[T]`` index into the ``R`` armed rows, on their device."""
    if (
        not isinstance(rows_T, torch.Tensor)
        or rows_T.dtype != torch.int64
        or rows_T.dim() != 1
        or rows_T.layout != torch.strided
        or rows_T.device != routes_RLK.device
    ):
        got = (
            f"{rows_T.dtype} {list(rows_T.shape)} on {rows_T.device}"
            if isinstance(rows_T, torch.Tensor)
            else type(rows_T).__name__
        )
        raise ReplayError(
            f"micro-batch {microbatch!r}: rows_T must be an int64 [T] tensor on the routes' "
            f"device ({routes_RLK.device}); got {got}"
        )
    if rows_T.numel():
        lo, hi = (int(v) for v in torch.aminmax(rows_T))  # one host sync per micro-batch
        if lo < 0 or hi >= routes_RLK.shape[0]:
            raise ReplayError(
                f"micro-batch {microbatch!r}: rows_T spans [{lo}, {hi}], outside the "
                f"{routes_RLK.shape[0]} armed rows [0, {routes_RLK.shape[0]})"
            )


def check_mask(microbatch: Hashable, replay_mask_T: object, rows: int) -> None:
    """``replay_mask_T`` is None or a dense bool ``[rows]`` tensor."""
    if replay_mask_T is None:
        return
    if not isinstance(replay_mask_T, torch.Tensor):
        raise ReplayError(
            f"micro-batch {microbatch!r}: replay mask must be a bool torch.Tensor "
            f"[{rows}] or None; got {type(replay_mask_T).__name__}"
        )
    if (
        replay_mask_T.shape != (rows,)
        or replay_mask_T.dtype != torch.bool
        or replay_mask_T.layout != torch.strided
    ):
        raise ReplayError(
            f"micro-batch {microbatch!r}: replay mask must be bool [{rows}]; "
            f"got {replay_mask_T.dtype} {list(replay_mask_T.shape)}"
        )


def check_flag(name: str, flag: object) -> None:
    """``flag`` is exactly True or False (a truthy string or 1 would read as a choice made)."""
    if not isinstance(flag, bool):
        raise ReplayError(f"{name} must be True or False; got {flag!r}")


def checked_walk(walked: object) -> list[tuple[int, nn.Module]]:
    """A custom walk's pairs, sorted by layer: each an (int >= 1, nn.Module), layers unique."""
    pairs = list(walked) if isinstance(walked, Sequence) else None
    if pairs is None or not all(
        isinstance(p, tuple)
        and len(p) == 2
        and type(p[0]) is int
        and p[0] >= 1
        and isinstance(p[1], nn.Module)
        for p in pairs
    ):
        raise ReplayError(
            "walk must return a sequence of (global 1-based layer number, router module) "
            f"pairs; got {walked!r:.200}"
        )
    layers = [layer for layer, _ in pairs]
    if len(set(layers)) != len(layers) or len({id(r) for _, r in pairs}) != len(pairs):
        raise ReplayError(f"walk returned a layer or a router twice: layers {layers}")
    return sorted(pairs, key=lambda p: p[0])


def check_target_ids(
    routes_TLK: torch.Tensor,
    *,
    num_experts: int,
    replay_mask_T: torch.Tensor | None,
    slot_layers: dict[int, int],
    microbatch: object,
    rows_T: torch.Tensor | None = None,
) -> None:
    """Raise :class:`ReplayError` if a replayed row holds an id outside ``[0, E)`` or repeats an
    id. ``slot_layers`` maps the checked slots to their layer numbers (for the message);
    ``rows_T`` (int64 ``[T]``, in range) reads the routes as ``[R, L, K]`` source rows, row t
    being ``routes_TLK[rows_T[t]]``."""
    slots = sorted(slot_layers)
    if _all_good_on_host(routes_TLK, num_experts, slots, rows_T, replay_mask_T):
        return
    if rows_T is not None:
        routes_TLK = routes_TLK.index_select(0, rows_T)
    used_TLK = routes_TLK if len(slots) == routes_TLK.shape[1] else routes_TLK[:, slots]
    if used_TLK.dtype in _WIDEN:  # torch reduces few ops on these; widen (exactly) to check
        used_TLK = used_TLK.to(_WIDEN[used_TLK.dtype])
    flags = row_flags(used_TLK, num_experts)
    out_of_range_TL = flags.out_of_range_R.reshape(used_TLK.shape[:2])
    repeated_TL = flags.repeated_R.reshape(used_TLK.shape[:2])
    bad_TL = out_of_range_TL | repeated_TL
    if replay_mask_T is not None:
        bad_TL &= replay_mask_T.to(bad_TL.device).unsqueeze(-1)
    if not bool(bad_TL.any()):  # the one host sync of arming
        return
    row, column = (int(v) for v in torch.nonzero(bad_TL)[0])
    layer = slot_layers[slots[column]]
    ids = used_TLK[row, column].tolist()
    problem = (
        f"ids outside [0, {num_experts})"
        if bool(out_of_range_TL[row, column])
        else "a repeated expert id (K distinct ids expected)"
    )
    count = int(bad_TL.sum())
    raise ReplayError(
        f"replay targets for micro-batch {microbatch!r}, layer {layer}, row {row}: {ids} hold "
        f"{problem}; {count} replayed (row, layer) pairs are bad. Validate routes where they are "
        "captured, or mark rows without a route invalid in the replay mask"
    )


def _all_good_on_host(
    routes_RLK: torch.Tensor,
    num_experts: int,
    slots: list[int],
    rows_T: torch.Tensor | None,
    replay_mask_T: torch.Tensor | None,
) -> bool:
    """For byte ids on the CPU (what an engine's routes decode to) where the compiled kernels
    run: whether every replayed (row, layer) is good, in one pass through the row index and the
    mask (a micro-batch's few torch ops on small tensors cost more than the check itself).
    False also where this does not apply; the torch path then checks, and names the first bad
    row."""
    k = routes_RLK.shape[-1]
    if (
        kernels.kernel() != "numba"
        or not idcheck_words.covers(routes_RLK)
        or routes_RLK.stride(-1) != 1
        or routes_RLK.stride(-2) != k
        or (replay_mask_T is not None and replay_mask_T.device.type != "cpu")
    ):
        return False
    words_RL = routes_RLK.numpy().view(idcheck_words.WORDS[k])[..., 0]
    every_slot = len(slots) == words_RL.shape[1]
    return not idcheck_numba.any_bad(
        words_RL,
        num_experts,
        kernels.EMPTY_INT64 if every_slot else np.asarray(slots, dtype=np.int64),
        kernels.EMPTY_INT64 if rows_T is None else rows_T.numpy(),
        kernels.EMPTY_BOOL if replay_mask_T is None else replay_mask_T.numpy(),
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
