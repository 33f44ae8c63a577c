"""The two layer axes a route tensor can be laid out on."""

from __future__ import annotations

from typing import Literal, get_args

#: ``all_layers``: one slot per decoder layer, slot i is global layer i+1 (what engines return).
#: ``moe_layers``: one slot per MoE layer, in layer order (what the trainer's routers consume).
LayerAxis = Literal["all_layers", "moe_layers"]
LAYER_AXES: tuple[str, ...] = get_args(LayerAxis)
