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
    used_TLK = routes_TLK if len(slots) == routes_TLK.shape[1] else routes_TLK[:, slots]
    out_of_range_TL, repeated_TL = _bad_rows(used_TLK, num_experts)
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


def _bad_rows(ids_TLK: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (row, slot): an id outside ``[0, E)``; a repeated id. Works on the K columns laid
    out contiguously (one copy), which is ~25x faster on CPU than sorting each row."""
    t, slots, k = ids_TLK.shape
    ids_KN = ids_TLK.reshape(-1, k).t().contiguous()
    out_of_range_N = ids_KN.amax(dim=0) >= num_experts
    if ids_KN.dtype.is_signed:
        out_of_range_N |= ids_KN.amin(dim=0) < 0
    repeated_N = torch.zeros_like(out_of_range_N)
    for i in range(k):  # K(K-1)/2 vectorised comparisons; K is small (top-k)
        for j in range(i + 1, k):
            repeated_N |= ids_KN[i] == ids_KN[j]
    return out_of_range_N.reshape(t, slots), repeated_N.reshape(t, slots)
