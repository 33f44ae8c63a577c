"""rr_core: exact MoE routing replay on plain torch tensors.

Torch-dependent names load on first use (PEP 562), so ``import rr_core`` and the ``rr`` command
stay fast and work even where importing torch fails.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rr_core._axis import LAYER_AXES, LayerAxis
from rr_core._errors import (
    AlignmentError,
    LayoutError,
    ReplayError,
    RouteValidationError,
    RRError,
    RRWarning,
    WalkError,
)

if TYPE_CHECKING:
    from rr_core._align import (
        align_routes as align_routes,
    )
    from rr_core._align import (
        pad_rows as pad_rows,
    )
    from rr_core._align import (
        replay_mask_for_lengths as replay_mask_for_lengths,
    )
    from rr_core._align import (
        truncate_routes as truncate_routes,
    )
    from rr_core._controller import (
        DEFAULT_MICROBATCH as DEFAULT_MICROBATCH,
    )
    from rr_core._controller import (
        ReplayController as ReplayController,
    )
    from rr_core._controller import (
        ReplayMode as ReplayMode,
    )
    from rr_core._controller import (
        StepReport as StepReport,
    )
    from rr_core._controller import (
        attached_router_count as attached_router_count,
    )
    from rr_core._controller import (
        controller_of as controller_of,
    )
    from rr_core._controller import (
        router_topk as router_topk,
    )
    from rr_core._layout import (
        LayoutConfig as LayoutConfig,
    )
    from rr_core._layout import (
        dense_layer_numbers as dense_layer_numbers,
    )
    from rr_core._layout import (
        is_moe_layer as is_moe_layer,
    )
    from rr_core._layout import (
        layer_offset as layer_offset,
    )
    from rr_core._layout import (
        moe_layer_numbers as moe_layer_numbers,
    )
    from rr_core._layout import (
        moe_ordinal as moe_ordinal,
    )
    from rr_core._layout import (
        moe_ordinals_of_stage as moe_ordinals_of_stage,
    )
    from rr_core._layout import (
        moe_pattern as moe_pattern,
    )
    from rr_core._layout import (
        num_layers_to_build as num_layers_to_build,
    )
    from rr_core._layout import (
        num_moe_layers as num_moe_layers,
    )
    from rr_core._layout import (
        stage_layer_numbers as stage_layer_numbers,
    )
    from rr_core._layout import (
        stage_moe_layer_numbers as stage_moe_layer_numbers,
    )
    from rr_core._layout import (
        stage_of_layer as stage_of_layer,
    )
    from rr_core._layout import (
        virtual_stage_layer_counts as virtual_stage_layer_counts,
    )
    from rr_core._layout_axis import (
        all_layers_to_moe_layers as all_layers_to_moe_layers,
    )
    from rr_core._layout_axis import (
        axis_length as axis_length,
    )
    from rr_core._layout_axis import (
        moe_layers_to_all_layers as moe_layers_to_all_layers,
    )
    from rr_core._layout_axis import (
        select_stage as select_stage,
    )
    from rr_core._routes import (
        PaddingSide as PaddingSide,
    )
    from rr_core._routes import (
        RouteBatch as RouteBatch,
    )
    from rr_core._routes import (
        RouteMeta as RouteMeta,
    )
    from rr_core._routes import (
        narrow_ids as narrow_ids,
    )
    from rr_core._routes import (
        narrowest_dtype as narrowest_dtype,
    )
    from rr_core._topk import (
        TopK as TopK,
    )
    from rr_core._topk import (
        native_topk as native_topk,
    )
    from rr_core._topk import (
        replay_topk as replay_topk,
    )
    from rr_core._topk import (
        same_sets_T as same_sets_T,
    )
    from rr_core._walk import (
        RouterPredicate as RouterPredicate,
    )
    from rr_core._walk import (
        decoder_scope as decoder_scope,
    )
    from rr_core._walk import (
        find_orphans as find_orphans,
    )
    from rr_core._walk import (
        is_router_by_name as is_router_by_name,
    )
    from rr_core._walk import (
        walk_routers as walk_routers,
    )

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "align_routes": "rr_core._align",
    "pad_rows": "rr_core._align",
    "replay_mask_for_lengths": "rr_core._align",
    "truncate_routes": "rr_core._align",
    "DEFAULT_MICROBATCH": "rr_core._controller",
    "ReplayController": "rr_core._controller",
    "ReplayMode": "rr_core._controller",
    "StepReport": "rr_core._controller",
    "attached_router_count": "rr_core._controller",
    "controller_of": "rr_core._controller",
    "router_topk": "rr_core._controller",
    "LayoutConfig": "rr_core._layout",
    "dense_layer_numbers": "rr_core._layout",
    "is_moe_layer": "rr_core._layout",
    "layer_offset": "rr_core._layout",
    "moe_layer_numbers": "rr_core._layout",
    "moe_ordinal": "rr_core._layout",
    "moe_ordinals_of_stage": "rr_core._layout",
    "moe_pattern": "rr_core._layout",
    "num_layers_to_build": "rr_core._layout",
    "num_moe_layers": "rr_core._layout",
    "stage_layer_numbers": "rr_core._layout",
    "stage_moe_layer_numbers": "rr_core._layout",
    "stage_of_layer": "rr_core._layout",
    "virtual_stage_layer_counts": "rr_core._layout",
    "all_layers_to_moe_layers": "rr_core._layout_axis",
    "axis_length": "rr_core._layout_axis",
    "moe_layers_to_all_layers": "rr_core._layout_axis",
    "select_stage": "rr_core._layout_axis",
    "PaddingSide": "rr_core._routes",
    "RouteBatch": "rr_core._routes",
    "RouteMeta": "rr_core._routes",
    "narrow_ids": "rr_core._routes",
    "narrowest_dtype": "rr_core._routes",
    "TopK": "rr_core._topk",
    "native_topk": "rr_core._topk",
    "replay_topk": "rr_core._topk",
    "same_sets_T": "rr_core._topk",
    "RouterPredicate": "rr_core._walk",
    "decoder_scope": "rr_core._walk",
    "find_orphans": "rr_core._walk",
    "is_router_by_name": "rr_core._walk",
    "walk_routers": "rr_core._walk",
}

__all__ = [
    "DEFAULT_MICROBATCH",
    "LAYER_AXES",
    "AlignmentError",
    "LayerAxis",
    "LayoutConfig",
    "LayoutError",
    "PaddingSide",
    "RRError",
    "RRWarning",
    "ReplayController",
    "ReplayError",
    "ReplayMode",
    "RouteBatch",
    "RouteMeta",
    "RouteValidationError",
    "RouterPredicate",
    "StepReport",
    "TopK",
    "WalkError",
    "__version__",
    "align_routes",
    "all_layers_to_moe_layers",
    "attached_router_count",
    "axis_length",
    "controller_of",
    "decoder_scope",
    "dense_layer_numbers",
    "find_orphans",
    "is_moe_layer",
    "is_router_by_name",
    "layer_offset",
    "moe_layer_numbers",
    "moe_layers_to_all_layers",
    "moe_ordinal",
    "moe_ordinals_of_stage",
    "moe_pattern",
    "narrow_ids",
    "narrowest_dtype",
    "native_topk",
    "num_layers_to_build",
    "num_moe_layers",
    "pad_rows",
    "replay_mask_for_lengths",
    "replay_topk",
    "router_topk",
    "same_sets_T",
    "select_stage",
    "stage_layer_numbers",
    "stage_moe_layer_numbers",
    "stage_of_layer",
    "truncate_routes",
    "virtual_stage_layer_counts",
    "walk_routers",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rr_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
