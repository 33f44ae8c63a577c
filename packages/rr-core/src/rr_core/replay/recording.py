"""The records: the ids routers in RECORD mode chose, per micro-batch, until the step ends.

Shapes: T tokens, E experts, L layers (the attached routers'), K top-k.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from rr_core.errors import ReplayError
from rr_core.replay.checks import ID_DTYPES
from rr_core.replay.topk import TopK, native_ids, replay_checked, replay_topk
from rr_core.routes.id_dtypes import holds_ids


class Records:
    """Per micro-batch, the ``[T, K]`` ids each router (walk index) recorded."""

    def __init__(self) -> None:
        self._recorded: dict[Hashable, list[torch.Tensor | None]] = {}

    def route(
        self,
        index: int,
        microbatch: Hashable,
        backward: bool,
        scores_TE: torch.Tensor,
        values_TE: torch.Tensor | None,
        *,
        layers: tuple[int, ...],
        top_k: int,
    ) -> TopK:
        """A RECORD-mode call of router ``index``: the native top-k, kept; its recompute in
        backward routes as the forward did."""
        records = self._recorded.setdefault(microbatch, [None] * len(layers))
        recorded_TK = records[index]
        if backward and recorded_TK is not None:  # recompute must route as the forward did
            return replay_topk(scores_TE, top_k, target_ids_TK=recorded_TK, values_TE=values_TE)
        if recorded_TK is not None:
            raise ReplayError(
                f"layer {layers[index]} recorded twice for micro-batch {microbatch!r}; "
                "give each forward its own micro-batch id or call end_step() between passes"
            )
        # ids off the graph and values by gather, as the recompute above replays them: a
        # non-reentrant checkpoint then sees the same saved tensors in forward and recompute
        # (torch.topk saves the [T, K] ids, a gather the [T, E] scores too: CheckpointError)
        ids_TK = native_ids(scores_TE, top_k)  # its top-k ranked these scores: all checked
        records[index] = ids_TK
        return replay_checked(scores_TE, top_k, ids_TK, values_TE=values_TE)

    def recorded(
        self,
        microbatch: Hashable,
        dtype: torch.dtype | None,
        *,
        layers: tuple[int, ...],
        num_experts: int,
        top_k: int,
    ) -> torch.Tensor:
        """One micro-batch's records as ``[T, L, K]`` (see :meth:`ReplayController.recorded`)."""
        if dtype is not None and (
            not isinstance(dtype, torch.dtype)
            or dtype not in ID_DTYPES
            or not holds_ids(dtype, num_experts)
        ):
            raise ReplayError(
                f"dtype must be an integer torch.dtype holding ids up to {num_experts - 1} "
                f"(num_experts={num_experts}); got {dtype!r}, which would change the ids"
            )
        records = self._recorded.get(microbatch)
        missing = (
            list(layers)
            if records is None
            else [layers[i] for i, r in enumerate(records) if r is None]
        )
        if records is None or missing:
            raise ReplayError(
                f"micro-batch {microbatch!r} has no record for layers {missing}; were they in "
                "RECORD mode when it ran forward?"
            )
        rows = [r for r in records if r is not None]
        if dtype is None:
            return torch.stack(rows, dim=1)
        out = torch.empty((rows[0].shape[0], len(rows), top_k), dtype=dtype, device=rows[0].device)
        for i, ids_TK in enumerate(rows):
            out[:, i].copy_(ids_TK)
        return out

    def release(self, microbatch: Hashable) -> None:
        self._recorded.pop(microbatch, None)

    def microbatches(self) -> tuple[Hashable, ...]:
        """The micro-batches something was recorded for, in the order first recorded."""
        return tuple(self._recorded)

    def end_step(self) -> None:
        self._recorded = {}
