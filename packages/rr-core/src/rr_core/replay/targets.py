"""Checks on replay targets, done once per micro-batch with a single host sync.

Shapes: T tokens, L layer slots, K top-k.
"""

from __future__ import annotations

import numpy as np
import torch

from rr_core import kernels
from rr_core.errors import ReplayError
from rr_core.routes import idcheck_numba, idcheck_words
from rr_core.routes.idcheck import row_flags

# uint64 ids above the int64 range wrap negative, so they are still out of range.
_WIDEN = {torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64}


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
