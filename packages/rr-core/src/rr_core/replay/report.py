"""The step report: what a step recorded and replayed, and how often the replayed sets agreed
with the native ones."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any


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
