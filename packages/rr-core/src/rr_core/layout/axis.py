"""Moving route tensors between the two layer axes and slicing them per pipeline stage.

Route tensors are ``[..., L, K]``: any leading dims (tokens, batch), the layer axis at dim -2 and
the K expert ids at dim -1. Engines return the ``all_layers`` axis (dense slots carry no route);
the trainer's routers consume the ``moe_layers`` axis. Converting with the wrong layout shifts every
MoE layer's targets (failure A2), so both directions check the axis length against the layout.
"""

from __future__ import annotations

import torch

from rr_core.errors import LayoutError
from rr_core.layout.pipeline import (
    LayoutConfig,
    layer_offset,
    moe_ordinals_of_stage,
    moe_pattern,
    num_layers_to_build,
    num_moe_layers,
)
from rr_core.routes.args import as_index
from rr_core.routes.axis import LayerAxis, check_layer_axis


def axis_length(cfg: LayoutConfig, axis: LayerAxis) -> int:
    """Number of slots on ``axis``: num_layers for ``all_layers``, MoE layers for ``moe_layers``."""
    if check_layer_axis(axis) == "all_layers":
        return cfg.num_layers
    return num_moe_layers(cfg)


def _check_axis(routes: torch.Tensor, cfg: LayoutConfig, axis: LayerAxis, name: str) -> None:
    expected = axis_length(cfg, axis)
    if not isinstance(routes, torch.Tensor):
        raise LayoutError(f"{name} must be a torch.Tensor [..., L, K]; got {type(routes).__name__}")
    if routes.dim() < 2 or routes.shape[-2] != expected:
        raise LayoutError(
            f"{name} has shape {tuple(routes.shape)} but the {axis} axis (dim -2 of [..., L, K]) "
            f"has {expected} slots for num_layers={cfg.num_layers} with "
            f"moe_layer_freq={cfg.moe_layer_freq!r}; convert the routes to the {axis} axis or fix "
            "the layout"
        )


def _moe_slots(cfg: LayoutConfig, device: torch.device) -> torch.Tensor:
    mask = torch.tensor(moe_pattern(cfg), dtype=torch.bool)
    return mask.nonzero().flatten().to(device)


def all_layers_to_moe_layers(routes_TLK: torch.Tensor, cfg: LayoutConfig) -> torch.Tensor:
    """Keep the MoE slots of an ``all_layers`` tensor, in layer order (dtype and device kept)."""
    _check_axis(routes_TLK, cfg, "all_layers", "routes_TLK")
    return routes_TLK.index_select(-2, _moe_slots(cfg, routes_TLK.device))


def moe_layers_to_all_layers(
    routes_TMK: torch.Tensor, cfg: LayoutConfig, fill: int = 0
) -> torch.Tensor:
    """Spread a ``moe_layers`` tensor onto the ``all_layers`` axis, dense slots set to ``fill``.

    ``fill`` is only a placeholder: dense slots carry no route, and callers that need to tell them
    apart use :func:`~rr_core.layout.pipeline.moe_pattern` rather than the fill value.
    """
    _check_axis(routes_TMK, cfg, "moe_layers", "routes_TMK")
    fill = as_index(fill, "fill", LayoutError)
    shape = (*routes_TMK.shape[:-2], cfg.num_layers, routes_TMK.shape[-1])
    routes_TLK = routes_TMK.new_full(shape, fill)
    return routes_TLK.index_copy_(-2, _moe_slots(cfg, routes_TMK.device), routes_TMK)


def select_stage(
    routes: torch.Tensor,
    cfg: LayoutConfig,
    axis: LayerAxis,
    pp_rank: int,
    vp_stage: int | None = None,
) -> torch.Tensor:
    """The slots of ``routes`` (on ``axis``) that one stage holds, as a view along dim -2.

    On ``moe_layers`` the slice starts at the count of MoE layers before the stage, not at its
    layer offset (failure A3); a stage's slots are contiguous on either axis.
    """
    _check_axis(routes, cfg, axis, "routes")
    if axis == "all_layers":
        start = layer_offset(cfg, pp_rank, vp_stage)
        return routes.narrow(-2, start, num_layers_to_build(cfg, pp_rank, vp_stage))
    ordinals = moe_ordinals_of_stage(cfg, pp_rank, vp_stage)
    start = ordinals[0] if ordinals else 0
    return routes.narrow(-2, start, len(ordinals))
