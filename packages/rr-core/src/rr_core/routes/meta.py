"""Route metadata: the expert count, top-k and the decoder layer each slot of the layer axis is.

A slot is a position on the layer axis of a route tensor; ``layer_numbers`` names the global
decoder layer of each slot, ``moe_layer_numbers`` those slots that carry routes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rr_core.checks import as_index
from rr_core.errors import LayoutError
from rr_core.routes.axis import LayerAxis, check_layer_axis
from rr_core.routes.validate import check_meta


@dataclass(frozen=True, kw_only=True)
class RouteMeta:
    """What a route tensor describes: expert count, top-k and which decoder layer each slot is.

    ``moe_layer_numbers`` lists the slots that carry routes; ``None`` means every slot. It is stored
    as ``None`` whenever it names every slot, so that equal layouts compare equal.
    """

    num_experts: int
    top_k: int
    layer_axis: LayerAxis
    layer_numbers: tuple[int, ...]
    moe_layer_numbers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        axis = check_layer_axis(self.layer_axis, "RouteMeta.layer_axis")
        object.__setattr__(self, "layer_axis", axis)  # a plain str, also for a str subclass
        layers, moe = check_meta(self)
        object.__setattr__(self, "layer_numbers", layers)
        object.__setattr__(self, "moe_layer_numbers", moe)

    @property
    def routed_layer_numbers(self) -> tuple[int, ...]:
        """Global layer numbers of the slots that carry routes."""
        return self.layer_numbers if self.moe_layer_numbers is None else self.moe_layer_numbers

    def slot_of(self, layer: int) -> int:
        """The slot (position on the layer axis) of global layer ``layer``; :class:`LayoutError`
        naming the axis's layers when it has none. On an all-layers axis of every decoder
        layer that is ``layer - 1``; on a MoE-layers or a stage's axis it is not."""
        number = as_index(layer, "layer", LayoutError)
        try:
            return self.layer_numbers.index(number)
        except ValueError:
            raise LayoutError(
                f"layer {number} is not on this {self.layer_axis} axis, whose layers are "
                f"{_span(self.layer_numbers)}"
            ) from None

    @property
    def moe_slots(self) -> tuple[int, ...]:
        """Slot indices (positions on the layer axis) that carry routes."""
        routed = set(self.routed_layer_numbers)
        return tuple(i for i, n in enumerate(self.layer_numbers) if n in routed)

    @property
    def dense_slots(self) -> tuple[int, ...]:
        """Slot indices of dense layers; they hold zeros."""
        routed = set(self.routed_layer_numbers)
        return tuple(i for i, n in enumerate(self.layer_numbers) if n not in routed)


def _span(numbers: Sequence[int]) -> str:
    if len(numbers) > 8:
        return f"[{', '.join(map(str, numbers[:4]))}, ..., {numbers[-1]}] ({len(numbers)} layers)"
    return str(list(numbers))
