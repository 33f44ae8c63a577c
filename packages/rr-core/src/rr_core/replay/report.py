"""The step report: what a step recorded, how often the replayed sets agreed with the native
ones, and the end-of-step check that every armed target was used (B2).

Shapes: T tokens, L layer slots, K top-k.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from rr_core.errors import ReplayError, RRWarning
from rr_core.replay.modes import ID_DTYPES, check_hashable
from rr_core.replay.state import DEFAULT_MICROBATCH, ControllerState
from rr_core.replay.tally import MAX_PENDING_ROWS, Tally, settle
from rr_core.routes.batch import holds_ids


@dataclass(frozen=True)
class StepReport:
    """What happened in a step: agreement per layer (share of replayed rows whose armed set
    equals the native set; 1.0 everywhere suggests replay changed nothing), order agreement per
    layer (share whose armed set agrees and whose slots are in the router's score order: ids
    replayed in another slot order than the trainer ranks them count in the first, not here)
    and the micro-batches."""

    agreement: dict[int, float] = field(default_factory=dict)
    order_agreement: dict[int, float] = field(default_factory=dict)
    #: where the step's armed routes came from (``arm_batch(provenance=)``), each distinct one
    provenance: tuple[dict[str, Any], ...] = ()
    replayed_microbatches: tuple[Hashable, ...] = ()
    recorded_microbatches: tuple[Hashable, ...] = ()

    def summary(self) -> str:
        """The agreement per layer next to the provenance of the routes replayed: a jump in
        disagreement after an engine upgrade shows beside the engine's release and settings."""
        order = self.order_agreement
        lines = [
            f"layer {layer}: agreement {share:.4f}, in order {order.get(layer, 0.0):.4f}"
            for layer, share in self.agreement.items()
        ] or ["no row replayed"]
        for p in self.provenance:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(p.items()))
            lines.append(f"routes from: {shown}")
        return "\n".join(lines)


class StepReports(ControllerState):
    """The controller's results: recorded ids, agreement, the step's end."""

    def recorded(
        self, microbatch: Hashable = DEFAULT_MICROBATCH, *, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """The ids recorded for one micro-batch as ``[T, L, K]`` on the attached routers'
        layers (a ``moe_layers`` axis: ``layer_numbers`` names the slots); ``dtype`` narrows
        them on the way, in one pass."""
        check_hashable(microbatch)
        if dtype is not None and (
            not isinstance(dtype, torch.dtype)
            or dtype not in ID_DTYPES
            or not holds_ids(dtype, self.num_experts)
        ):
            raise ReplayError(
                f"dtype must be an integer torch.dtype holding ids up to {self.num_experts - 1} "
                f"(num_experts={self.num_experts}); got {dtype!r}, which would change the ids"
            )
        records = self._recorded.get(microbatch)
        missing = (
            list(self._layers)
            if records is None
            else [self._layers[i] for i, r in enumerate(records) if r is None]
        )
        if records is None or missing:
            raise ReplayError(
                f"micro-batch {microbatch!r} has no record for layers {missing}; were they in "
                "RECORD mode when it ran forward?"
            )
        rows = [r for r in records if r is not None]
        if dtype is None:
            return torch.stack(rows, dim=1)
        out = torch.empty(
            (rows[0].shape[0], len(rows), self.top_k), dtype=dtype, device=rows[0].device
        )
        for i, ids_TK in enumerate(rows):
            out[:, i].copy_(ids_TK)
        return out

    def agreement(self) -> dict[int, float]:
        """Per layer, the share of replayed rows whose armed set equals the native set, this
        step so far. Layers that replayed no row are absent."""
        return self._shares(0)

    def order_agreement(self) -> dict[int, float]:
        """Per layer, the share of replayed rows whose armed set agrees and whose ids are in
        the router's score order, this step so far."""
        return self._shares(1)

    def _shares(self, column: int) -> dict[int, float]:
        settle(self._agreement)
        self._pending_rows = 0
        return {
            self._layers[index]: tally.count(column) / tally.rows
            for index, tally in sorted(self._agreement.items())
            if tally.rows
        }

    def end_step(self) -> StepReport:
        """Finish a step: report, check that every armed target was used, and clear all
        targets, records and counters (even when the check fails)."""
        report = StepReport(
            agreement=self.agreement(),
            order_agreement=self.order_agreement(),
            provenance=tuple(_distinct(self._provenance.values())),
            replayed_microbatches=tuple(self._armed),
            recorded_microbatches=tuple(self._recorded),
        )
        unused = {
            mb: [self._layers[i] for i, used in enumerate(a.consumed) if not used]
            for mb, a in self._armed.items()
        }
        unused = {mb: layers for mb, layers in unused.items() if layers}
        self._reset_step()
        if unused:
            message = f"armed targets were never used (micro-batch -> layers): {unused}"
            if self.strict:
                raise ReplayError(message + "; was the router in REPLAY mode, and did it run?")
            warnings.warn(message, RRWarning, stacklevel=2)
        return report

    def _add_agreement(
        self, index: int, agree_T: torch.Tensor, in_order_T: torch.Tensor, rows: int
    ) -> None:
        # the row tests stay on their device, unsummed, until the report (see rr_core.replay.
        # tally): no reduction and no host sync per router call
        tally = self._agreement.setdefault(index, Tally())
        self._pending_rows += tally.add(agree_T, in_order_T, rows)
        if self._pending_rows > MAX_PENDING_ROWS:
            settle(self._agreement)
            self._pending_rows = 0


def _distinct(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out
