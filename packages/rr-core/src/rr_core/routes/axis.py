"""The two layer axes a route tensor can be laid out on, and the check for such string choices."""

from __future__ import annotations

from typing import Literal, cast, get_args

from rr_core.errors import LayoutError, RRError

#: ``all_layers``: one slot per decoder layer, slot i is global layer i+1 (what engines return).
#: ``moe_layers``: one slot per MoE layer, in layer order (what the trainer's routers consume).
LayerAxis = Literal["all_layers", "moe_layers"]
LAYER_AXES: tuple[str, ...] = get_args(LayerAxis)


def check_choice(value: object, choices: tuple[str, ...], what: str, error: type[RRError]) -> str:
    """``value`` as a plain str if it is exactly one of ``choices``, else ``error`` naming them.
    Only strings qualify: an array or a list must not be compared element by element."""
    if isinstance(value, str) and value in choices:
        return str(value)
    raise error(
        f"{what} must be one of {', '.join(map(repr, choices))}; got {value!r} "
        f"({type(value).__name__})"
    )


def check_layer_axis(axis: object, what: str = "layer axis") -> LayerAxis:
    """``axis`` as a :data:`LayerAxis`, or :class:`LayoutError`."""
    return cast(LayerAxis, check_choice(axis, LAYER_AXES, what, LayoutError))
