"""The checks that make replay on a Megatron model exact or raise, then the attach itself
(called by :class:`~rr_megatron_compat._install.MegatronAdapter`, whose ``attach`` has checked the
controller, the model and that the hooks are installed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from rr_core import ReplayController, ReplayError, walk_routers
from rr_core.checks import check_flag
from rr_megatron_compat._guards import ReplayConfigError, check_replay_config
from rr_megatron_compat._stats import ignore_unreplayed_rows
from rr_megatron_compat._versions import megatron_line


def check_attach_options(capacity: str, ignore_unreplayed_in_stats: bool) -> None:
    check_flag(ignore_unreplayed_in_stats, "ignore_unreplayed_in_stats", ReplayError)
    check_replay_config(None, capacity=capacity)


def attach_routers(
    controller: ReplayController,
    model: nn.Module | Sequence[nn.Module],
    *,
    capacity: str = "warn",
    ignore_unreplayed_in_stats: bool = False,
) -> tuple[int, ...]:
    """``controller.attach(model)`` for a Megatron model (or its VPP chunks), after checking
    that every router can be driven: its config passes
    :func:`check_replay_config`, it has E / K equal to the controller's, and on 0.16+ it was
    built with ``moe_enable_routing_replay`` (:func:`enable_replay`). Routers are addressed by
    walking the forwarded model, never through Megatron's global RouterReplay list (A1), and
    MTP routers are never attached (A4). ``ignore_unreplayed_in_stats`` (C4) keeps rows outside
    the replay mask out of the expert-bias token counts. Returns the layer numbers attached."""
    check_attach_options(capacity, ignore_unreplayed_in_stats)
    native = megatron_line().native_replay
    walked = walk_routers(model)
    for layer, router in walked:
        config: Any = getattr(router, "config", None)
        check_replay_config(config, capacity=capacity)
        experts, topk = getattr(config, "num_moe_experts", None), getattr(router, "topk", None)
        if (experts, topk) != (controller.num_experts, controller.top_k):
            raise ReplayConfigError(
                f"layer {layer}: router has E={experts}, K={topk}; the controller expects "
                f"E={controller.num_experts}, K={controller.top_k}"
            )
        if native and getattr(router, "router_replay", None) is None:
            raise ReplayConfigError(
                f"layer {layer}: this router has no RouterReplay; on megatron-core "
                f"{megatron_line().version} call rr_megatron_compat.enable_replay(config) "
                "before building the model"
            )
    layers = controller.attach(model, walk=lambda _: walked)  # the walk checked above, once
    ignore_unreplayed_rows((r for _, r in walked), ignore_unreplayed_in_stats)
    return layers
