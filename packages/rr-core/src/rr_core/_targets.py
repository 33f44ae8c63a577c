"""Checks on replay targets, done once per micro-batch with a single host sync.

Shapes: T tokens, L layer slots, K top-k.
"""

from __future__ import annotations

import torch

from rr_core._errors import ReplayError


def check_target_ids(
    routes_TLK: torch.Tensor,
    *,
    num_experts: int,
    replay_mask_T: torch.Tensor | None,
    slot_layers: dict[int, int],
    microbatch: object,
) -> None:
    """Raise :class:`ReplayError` if a replayed row holds an id outside ``[0, E)`` or repeats an
    id. ``slot_layers`` maps the checked slots to their layer numbers (for the message)."""
    slots = sorted(slot_layers)
    used_TLK = routes_TLK[:, slots]
    ids_TLK = used_TLK.to(torch.int64)
    out_of_range_TL = ((ids_TLK < 0) | (ids_TLK >= num_experts)).any(dim=-1)
    sorted_TLK = ids_TLK.sort(dim=-1).values
    repeated_TL = (sorted_TLK[..., 1:] == sorted_TLK[..., :-1]).any(dim=-1)
    bad_TL = out_of_range_TL | repeated_TL
    if replay_mask_T is not None:
        bad_TL &= replay_mask_T.to(bad_TL.device).unsqueeze(-1)
    if not bool(bad_TL.any()):  # the one host sync of arming
        return
    row, column = (int(v) for v in torch.nonzero(bad_TL)[0])
    layer = slot_layers[slots[column]]
    ids = ids_TLK[row, column].tolist()
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
