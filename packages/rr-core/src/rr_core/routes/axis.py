"""The two layer axes a route tensor can be laid out on."""

from __future__ import annotations

from typing import Literal, cast, get_args

from rr_core.checks import check_choice
from rr_core.errors import LayoutError

#: ``all_layers``: one slot per decoder layer, slot i is global layer i+1 (what engines return).
#: ``moe_layers``: one slot per MoE layer, in layer order (what the trainer's routers consume).
LayerAxis = Literal["all_layers", "moe_layers"]
LAYER_AXES: tuple[str, ...] = get_args(LayerAxis)


def check_layer_axis(axis: object, what: str = "layer axis") -> LayerAxis:
    """``axis`` as a :data:`LayerAxis`, or :class:`LayoutError`."""
    return cast(LayerAxis, check_choice(axis, what, LAYER_AXES, LayoutError))
